package conform

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
)

// Observed is what a participant did with a case's records.
type Observed struct {
	// Replies are the replies to the case's saga, in the order they came
	// (probes left out).
	Replies []ObservedReply
	// Effects are the effects table's rows of the saga (probes left out).
	Effects []Effect
	// Poisoned holds the indexes of the sends seen on the poison topic.
	Poisoned map[int]bool
}

// ObservedReply is a reply as the participant wrote it: its key, its
// headers (metadata) and payload.
type ObservedReply struct {
	Key     string
	Headers map[string]string
	Payload []byte
}

// Check compares what was observed of the case's saga sagaID with what
// the case expects, and returns each difference.
func (c Case) Check(sagaID string, o Observed) []string {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	// Replies, in order per step: one saga's replies keep their order, and
	// a participant that handles a batch of commands at once may answer
	// two steps in either order.
	steps := []string{}
	for _, s := range c.Sends {
		if !slices.Contains(steps, s.Step) {
			steps = append(steps, s.Step)
		}
	}
	byStep := map[string][]ObservedReply{}
	for _, r := range o.Replies {
		step := r.Headers[core.MetadataSagaStep]
		if !slices.Contains(steps, step) {
			add("a reply for step %q, which the case did not send: %s", step, describe(r))
			continue
		}
		byStep[step] = append(byStep[step], r)
	}
	for _, step := range steps {
		var want []Reply
		for _, r := range c.Replies {
			if c.Sends[r.Send].Step == step {
				want = append(want, r)
			}
		}
		got := byStep[step]
		for i := 0; i < max(len(want), len(got)); i++ {
			switch {
			case i >= len(got):
				add("step %s: reply %d of %d (to send %d) did not come", step, i+1, len(want), want[i].Send)
			case i >= len(want):
				add("step %s: an extra reply: %s", step, describe(got[i]))
			default:
				for _, p := range c.checkReply(sagaID, want[i], got[i]) {
					add("step %s, reply to send %d: %s", step, want[i].Send, p)
				}
			}
		}
	}

	// Effects, as a multiset.
	want := map[string]int{}
	for _, e := range c.Effects {
		want[e.String()]++
	}
	got := map[string]int{}
	for _, e := range o.Effects {
		got[e.String()]++
	}
	if !maps.Equal(want, got) {
		add("effects %s, want %s", effectList(got), effectList(want))
	}

	// Poisoned sends.
	for _, i := range c.Poisoned {
		if !o.Poisoned[i] {
			add("send %d was not poisoned", i)
		}
	}
	for i := range o.Poisoned {
		if !slices.Contains(c.Poisoned, i) {
			add("send %d was poisoned", i)
		}
	}
	return problems
}

// checkReply compares one reply with what was expected of it.
func (c Case) checkReply(sagaID string, want Reply, got ObservedReply) []string {
	var p []string
	s := c.Sends[want.Send]
	h := got.Headers
	expect := map[string]string{
		core.MetadataSagaProtocol:  core.SagaProtocolVersion,
		core.MetadataSagaID:        sagaID,
		core.MetadataSagaType:      SagaType,
		core.MetadataSagaStep:      s.Step,
		core.MetadataSagaAttempt:   strconv.Itoa(s.Attempt),
		core.MetadataSagaOperation: s.Operation,
		core.MetadataSagaCommand:   s.Command,
		core.MetadataSagaOutcome:   want.Outcome,
		core.MetadataEventType:     "saga.reply",
		core.MetadataContentType:   core.ContentTypeJSON,
	}
	for _, k := range slices.Sorted(maps.Keys(expect)) {
		if h[k] != expect[k] {
			p = append(p, fmt.Sprintf("header %s is %q, want %q", k, h[k], expect[k]))
		}
	}
	if got.Key != sagaID {
		p = append(p, fmt.Sprintf("key %q, want the saga id %q", got.Key, sagaID))
	}
	reason := h[core.MetadataSagaReason]
	switch {
	case want.ReasonPrefix != "" && !strings.HasPrefix(reason, want.ReasonPrefix):
		p = append(p, fmt.Sprintf("reason %q, want one starting with %q", reason, want.ReasonPrefix))
	case want.ReasonPrefix == "" && reason != want.Reason:
		p = append(p, fmt.Sprintf("reason %q, want %q", reason, want.Reason))
	}
	wantPayload := []byte("{}")
	if len(want.Payload) > 0 {
		key := compensation.IdempotencyKey(sagaID, s.Step, s.Operation)
		wantPayload = bytes.ReplaceAll(want.Payload, []byte("{{key}}"), []byte(key))
	}
	if !sameJSON(wantPayload, got.Payload) {
		p = append(p, fmt.Sprintf("payload %s, want %s", got.Payload, wantPayload))
	}
	return p
}

// sameJSON reports whether a and b are the same JSON value.
func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

func describe(r ObservedReply) string {
	h := r.Headers
	return fmt.Sprintf("%s #%s %s %q %s", h[core.MetadataSagaOperation], h[core.MetadataSagaAttempt],
		h[core.MetadataSagaOutcome], h[core.MetadataSagaReason], r.Payload)
}

func effectList(m map[string]int) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		for range m[k] {
			out = append(out, k)
		}
	}
	return "[" + strings.Join(out, " ") + "]"
}
