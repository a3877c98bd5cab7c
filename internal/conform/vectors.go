// Package conform runs the saga wire protocol's test vectors
// (testdata/protocol, docs/protocol.md "Conformance") against a
// participant: the cases and what each expects, the conformance commands
// of the Go participant, and the conformance kit, which drives a
// participant in any language over Kafka (millrace conform participant).
package conform

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"

	"github.com/google/uuid"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/testdata/protocol"
)

// The conformance command and the defaults of a case's sends.
const (
	// Command is the one command a participant under test registers.
	Command = "conform.reserve"
	// DefaultStep is the step of a send that names none.
	DefaultStep = "credit"
	// SagaType is the saga_type of every command the kit sends.
	SagaType = "conform"
	// HeaderSend names the send a record is, SAGA#INDEX, so that its
	// poisoned copy can be recognized.
	HeaderSend = "conform_send"
	// HeaderWatermillUUID is the record header of Watermill's message
	// UUID, which Watermill's Kafka unmarshaler reads.
	HeaderWatermillUUID = "_watermill_message_uuid"
)

// Case is one case of a participant's rules: one saga's commands, and
// the replies, effects and poisoned records they must produce.
type Case struct {
	Name     string   `json:"name"`
	About    string   `json:"about"`
	Sends    []Send   `json:"sends"`
	Replies  []Reply  `json:"replies"`
	Effects  []Effect `json:"effects"`
	Poisoned []int    `json:"poisoned"`
}

// Send is one command record of a case.
type Send struct {
	Step       string          `json:"step"`
	Operation  string          `json:"operation"`
	Attempt    int             `json:"attempt"`
	Command    string          `json:"command"`
	Payload    json.RawMessage `json:"payload"`
	RawPayload *string         `json:"raw_payload"`
	// Event labels the record: two sends with one label are one record
	// delivered twice. Empty: a record of its own.
	Event string `json:"event"`
	// Protocol is the saga_protocol header: absent "1", null none.
	Protocol json.RawMessage `json:"protocol"`
	// Headers override the defaults; a null value removes one.
	Headers map[string]*string `json:"headers"`
	// EventID, if set, is the event_id header as given (not a UUID).
	EventID *string `json:"event_id"`
}

// Reply is a reply a case expects, to its send Send.
type Reply struct {
	Send         int             `json:"send"`
	Outcome      string          `json:"outcome"`
	Reason       string          `json:"reason"`
	ReasonPrefix string          `json:"reason_prefix"`
	Payload      json.RawMessage `json:"payload"`
}

// Effect is a row of the participant's effects table.
type Effect struct {
	Step      string `json:"step"`
	Operation string `json:"operation"`
	Amount    int64  `json:"amount"`
}

func (e Effect) String() string { return fmt.Sprintf("%s/%s/%d", e.Step, e.Operation, e.Amount) }

// Cases returns the cases of testdata/protocol/cases, by name.
func Cases() ([]Case, error) {
	names, err := fs.Glob(protocol.FS, "cases/*.json")
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var out []Case
	for _, n := range names {
		b, err := protocol.FS.ReadFile(n)
		if err != nil {
			return nil, err
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		var c Case
		if err := dec.Decode(&c); err != nil {
			return nil, fmt.Errorf("conform: %s: %w", n, err)
		}
		if c.Name+".json" != path.Base(n) {
			return nil, fmt.Errorf("conform: %s holds case %q", n, c.Name)
		}
		for i := range c.Sends {
			if c.Sends[i].Step == "" {
				c.Sends[i].Step = DefaultStep
			}
			if c.Sends[i].Command == "" {
				c.Sends[i].Command = Command
			}
		}
		for i := range c.Effects {
			if c.Effects[i].Step == "" {
				c.Effects[i].Step = DefaultStep
			}
		}
		for _, r := range c.Replies {
			if r.Send < 0 || r.Send >= len(c.Sends) {
				return nil, fmt.Errorf("conform: case %s: a reply to send %d, of %d", c.Name, r.Send, len(c.Sends))
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// Crashes reports whether the case makes the participant crash: a send
// whose payload says "crash": true.
func (c Case) Crashes() bool {
	for _, s := range c.Sends {
		if s.crash() {
			return true
		}
	}
	return false
}

func (s Send) crash() bool {
	var p struct {
		Crash bool `json:"crash"`
	}
	return json.Unmarshal(s.Payload, &p) == nil && p.Crash
}

// Record is a command record to produce: its key, value and headers.
type Record struct {
	Key     string
	Value   []byte
	Headers map[string]string
	// UUID is the record's Watermill message UUID (HeaderWatermillUUID).
	UUID string
}

// Records builds the case's records for saga sagaID, replies to
// replyTopic, with new event ids (one per event label).
func (c Case) Records(sagaID, replyTopic string) []Record {
	labels := map[string]string{}
	out := make([]Record, len(c.Sends))
	for i, s := range c.Sends {
		id := uuid.NewString()
		if s.Event != "" {
			if l, ok := labels[s.Event]; ok {
				id = l
			} else {
				labels[s.Event] = id
			}
		}
		h := map[string]string{
			HeaderWatermillUUID:         id,
			core.MetadataEventID:        id,
			core.MetadataPartitionKey:   sagaID,
			core.MetadataContentType:    core.ContentTypeJSON,
			core.MetadataSagaProtocol:   core.SagaProtocolVersion,
			core.MetadataSagaID:         sagaID,
			core.MetadataSagaType:       SagaType,
			core.MetadataSagaStep:       s.Step,
			core.MetadataSagaAttempt:    strconv.Itoa(s.Attempt),
			core.MetadataSagaOperation:  s.Operation,
			core.MetadataSagaCommand:    s.Command,
			core.MetadataSagaReplyTopic: replyTopic,
			HeaderSend:                  sagaID + "#" + strconv.Itoa(i),
		}
		if len(s.Protocol) > 0 {
			var v *string
			_ = json.Unmarshal(s.Protocol, &v)
			if v == nil {
				delete(h, core.MetadataSagaProtocol)
			} else {
				h[core.MetadataSagaProtocol] = *v
			}
		}
		if s.EventID != nil {
			h[core.MetadataEventID] = *s.EventID
		}
		for k, v := range s.Headers {
			if v == nil {
				delete(h, k)
			} else {
				h[k] = *v
			}
		}
		value := []byte(s.Payload)
		if s.RawPayload != nil {
			value = []byte(*s.RawPayload)
		}
		out[i] = Record{Key: sagaID, Value: value, Headers: h, UUID: id}
	}
	return out
}

// Probe is the record whose reply says that the records of saga sagaID
// sent before it were handled: an action of step "probe", which answers
// after them (one saga's records are handled in order).
func Probe(sagaID, replyTopic string) Record {
	c := Case{Sends: []Send{{Step: ProbeStep, Operation: core.OperationAction, Attempt: 1, Command: Command, Payload: json.RawMessage(`{"amount":0}`)}}}
	return c.Records(sagaID, replyTopic)[0]
}

// ProbeStep is the step of the probe commands.
const ProbeStep = "probe"
