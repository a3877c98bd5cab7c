// Package redact hides the values of a JSON payload's fields, keeping its
// shape: what the console and the millrace command show of a payload an
// operator may not read whole.
package redact

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
)

// Mask replaces each redacted value.
const Mask = `"[redacted]"`

// JSON returns payload with the value of every field named in fields
// (matched without regard to case, at any depth; a redacted object or
// array has each of its values redacted) replaced by Mask, keys and order
// kept; with no fields, every value. It reports false when payload is not
// one JSON value.
func JSON(payload []byte, fields ...string) ([]byte, bool) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var out bytes.Buffer
	w := walker{dec: dec, out: &out, fields: fields}
	if err := w.value(len(fields) == 0); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, false
	}
	return out.Bytes(), true
}

type walker struct {
	dec    *json.Decoder
	out    *bytes.Buffer
	fields []string
}

func (w *walker) named(key string) bool {
	for _, f := range w.fields {
		if strings.EqualFold(f, key) {
			return true
		}
	}
	return false
}

// value copies the next value, its scalars replaced by Mask when hide.
func (w *walker) value(hide bool) error {
	tok, err := w.dec.Token()
	if err != nil {
		return err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		if hide {
			w.out.WriteString(Mask)
			return nil
		}
		raw, err := json.Marshal(tok)
		if err != nil {
			return err
		}
		w.out.Write(raw)
		return nil
	}
	closing := map[json.Delim]byte{'{': '}', '[': ']'}[d]
	if closing == 0 {
		return errors.New("redact: unexpected " + d.String())
	}
	w.out.WriteByte(byte(d))
	for i := 0; w.dec.More(); i++ {
		if i > 0 {
			w.out.WriteByte(',')
		}
		hideValue := hide
		if d == '{' {
			key, err := w.dec.Token()
			if err != nil {
				return err
			}
			s, _ := key.(string)
			raw, _ := json.Marshal(s)
			w.out.Write(raw)
			w.out.WriteByte(':')
			hideValue = hide || w.named(s)
		}
		if err := w.value(hideValue); err != nil {
			return err
		}
	}
	if _, err := w.dec.Token(); err != nil { // the closing delimiter
		return err
	}
	w.out.WriteByte(closing)
	return nil
}
