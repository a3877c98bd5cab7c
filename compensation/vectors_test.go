package compensation_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/conform"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/testdata/protocol"
)

// The protocol's test vectors (testdata/protocol/cases, docs/protocol.md)
// through the Go participant in process, so that the participant and the
// specification cannot drift: each case's records as the messages a Kafka
// subscriber would deliver, handled one per transaction behind the inbox's
// dedup middleware (as AddToRouter wires it) and all in one batch
// (RunBatched's path); the replies read
// from the outbox, the effects from the conformance table. A crash is a
// technical error at the action's crash point: the transaction rolls back,
// and the record is delivered again. The kit runs the same cases over
// Kafka against a participant process (internal/conform).
func TestVectors(t *testing.T) {
	t.Parallel()
	cases, err := conform.Cases()
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) < 15 {
		t.Fatalf("%d cases", len(cases))
	}
	for _, wiring := range []string{"one", "batch"} {
		t.Run(wiring, func(t *testing.T) {
			t.Parallel()
			v := setupVectors(t)
			for _, c := range cases {
				t.Run(c.Name, func(t *testing.T) {
					t.Parallel()
					sagaID := "vector-" + c.Name
					recs := c.Records(sagaID, replyTopic)
					msgs := make([]*message.Message, len(recs))
					for i, r := range recs {
						msgs[i] = v.message(r)
					}
					if c.Crashes() {
						v.arm(sagaID)
					}
					var poisoned map[int]bool
					if wiring == "one" {
						poisoned = v.deliverEach(t, msgs)
					} else {
						poisoned = v.deliverBatch(t, msgs)
					}
					if c.Crashes() && v.armed(sagaID) {
						t.Error("the crash point was not reached")
					}
					for _, p := range c.Check(sagaID, v.observe(t, sagaID, poisoned)) {
						t.Error(p)
					}
				})
			}
		})
	}
}

type vectors struct {
	db     *pgtest.DB
	p      *compensation.Participant
	dedup  *inbox.Deduplicator
	handle func(*message.Message) error

	mu    sync.Mutex
	crash map[string]bool // saga ids whose next crash point crashes
}

var errCrashed = errors.New("crashed at the conformance action's crash point")

func setupVectors(t *testing.T) *vectors {
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 8})
	v := &vectors{db: db, crash: map[string]bool{}}
	if _, err := db.Pool.Exec(context.Background(), conform.EffectsTableSQL(db.Schema)); err != nil {
		t.Fatal(err)
	}
	p, err := compensation.NewParticipant(db.Pool, compensation.Config{Schema: db.Schema, Name: "conform"})
	if err != nil {
		t.Fatal(err)
	}
	if err := conform.Register(p, db.Schema, v.crashPoint); err != nil {
		t.Fatal(err)
	}
	v.p = p
	if v.dedup, err = inbox.NewDeduplicator(db.Pool, inbox.DedupConfig{Schema: db.Schema, Consumer: "conform"}); err != nil {
		t.Fatal(err)
	}
	v.handle = p.Handle
	return v
}

func (v *vectors) arm(sagaID string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.crash[sagaID] = true
}

func (v *vectors) armed(sagaID string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.crash[sagaID]
}

// crashPoint crashes once per armed saga, as the crash file does.
func (v *vectors) crashPoint(call compensation.Call) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.crash[call.SagaID] {
		delete(v.crash, call.SagaID)
		return errCrashed
	}
	return nil
}

// message is the Watermill message a Kafka subscriber delivers for r.
func (v *vectors) message(r conform.Record) *message.Message {
	msg := message.NewMessage(r.UUID, r.Value)
	for k, val := range r.Headers {
		if k != conform.HeaderWatermillUUID {
			msg.Metadata.Set(k, val)
		}
	}
	return msg
}

// deliverEach handles msgs one per transaction, as a Router with the dedup
// middleware does: a permanent error poisons the message, a crash delivers
// it again.
func (v *vectors) deliverEach(t *testing.T, msgs []*message.Message) map[int]bool {
	poisoned := map[int]bool{}
	for i, m := range msgs {
		err := v.handle(m.Copy())
		if errors.Is(err, errCrashed) {
			err = v.handle(m.Copy())
		}
		switch {
		case err == nil:
		case core.IsPermanent(err):
			poisoned[i] = true
		default:
			t.Fatalf("send %d: %v", i, err)
		}
	}
	return poisoned
}

// deliverBatch handles msgs in one batch, as RunBatched does (its
// runBatch): the marks, the poisoned messages taken out (and answered
// where they can be), the rest handled; a crash rolls the transaction back
// and the batch is delivered again.
func (v *vectors) deliverBatch(t *testing.T, msgs []*message.Message) map[int]bool {
	ctx := context.Background()
	for try := 0; ; try++ {
		if try > len(msgs)+2 {
			t.Fatal("the batch never went through")
		}
		todo := make([]*message.Message, len(msgs))
		for i, m := range msgs {
			todo[i] = m.Copy()
		}
		bad, err := compensation.RunBatch(ctx, v.p, todo)
		switch {
		case err == nil:
			poisoned := map[int]bool{}
			for i, m := range msgs {
				if e := bad[m.UUID]; e != nil {
					if !core.IsPermanent(e) {
						t.Fatalf("%s: %v, not permanent", m.UUID, e)
					}
					poisoned[i] = true
				}
			}
			return poisoned
		case errors.Is(err, errCrashed):
		default:
			t.Fatal(err)
		}
	}
}

// observe reads the saga's replies from the outbox and its effects.
func (v *vectors) observe(t *testing.T, sagaID string, poisoned map[int]bool) conform.Observed {
	ctx := context.Background()
	o := conform.Observed{Poisoned: poisoned}
	rows, err := v.db.Pool.Query(ctx, fmt.Sprintf(`SELECT partition_key, event_type, headers, payload::text FROM %s
 WHERE partition_key = $1 AND event_type = 'saga.reply' ORDER BY id`, sqlident.Table(v.db.Schema, "outbox_event")), sagaID)
	if err != nil {
		t.Fatal(err)
	}
	o.Replies, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (conform.ObservedReply, error) {
		var (
			rep       conform.ObservedReply
			eventType string
			payload   string
		)
		if err := r.Scan(&rep.Key, &eventType, &rep.Headers, &payload); err != nil {
			return rep, err
		}
		rep.Headers[core.MetadataEventType] = eventType // the relay adds it
		rep.Payload = []byte(payload)
		return rep, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rows, err = v.db.Pool.Query(ctx, conform.EffectsQuery(v.db.Schema)+` WHERE saga_id = $1`, sagaID)
	if err != nil {
		t.Fatal(err)
	}
	o.Effects, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (conform.Effect, error) {
		var (
			e  conform.Effect
			id string
		)
		return e, r.Scan(&id, &e.Step, &e.Operation, &e.Amount)
	})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// The derived values of testdata/protocol: idempotency keys, lanes, the
// wake-up channel, the event id of a record without one.
func TestVectorsDerivedValues(t *testing.T) {
	t.Parallel()
	var keys struct {
		Keys []struct {
			SagaID               string `json:"saga_id"`
			Step, Operation, Key string
		}
	}
	readVector(t, "idempotency_keys.json", &keys)
	for _, k := range keys.Keys {
		if got := compensation.IdempotencyKey(k.SagaID, k.Step, k.Operation); got != k.Key {
			t.Errorf("IdempotencyKey(%q, %q, %q) = %s, the vector says %s", k.SagaID, k.Step, k.Operation, got, k.Key)
		}
	}
	var ob struct {
		Channels       []struct{ Schema, Channel string }
		RecordEventIDs []struct {
			Topic     string
			Partition int32
			Offset    int64
			EventID   string `json:"event_id"`
		} `json:"record_event_ids"`
	}
	readVector(t, "outbox.json", &ob)
	// The lanes are checked in package outbox (TestLaneVectors).
	for _, c := range ob.Channels {
		if got := "millrace_outbox_" + sqlident.Hash(c.Schema); got != c.Channel {
			t.Errorf("channel of schema %q = %s, the vector says %s", c.Schema, got, c.Channel)
		}
	}
	// The id kafka.Subscriber gives a record without one, as package kafka
	// documents it (its own tests check the Subscriber against the same).
	for _, r := range ob.RecordEventIDs {
		got := uuid.NewSHA1(uuid.MustParse("5b1e0c1e-6f0a-4a8e-9a57-6d696c6c7261"), fmt.Appendf(nil, "%s/%d/%d", r.Topic, r.Partition, r.Offset)).String()
		if got != r.EventID {
			t.Errorf("record id of %q/%d/%d = %s, the vector says %s", r.Topic, r.Partition, r.Offset, got, r.EventID)
		}
	}
	if len(keys.Keys) == 0 || len(ob.Channels) == 0 || len(ob.RecordEventIDs) == 0 {
		t.Fatal("empty vectors")
	}
}

func readVector(t *testing.T, name string, v any) {
	t.Helper()
	b, err := protocol.FS.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}
