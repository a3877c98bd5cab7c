package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
)

// With OrderByKey, a key whose first row waits (dead, or backing off) holds
// only its own rows: the rows of other keys behind a long run of held rows
// are still claimed and applied. The held run is longer than a batch, so a
// claim that applied its LIMIT before the hold would return nothing, forever.
func TestProcessorOrderByKeyHeldKeyDoesNotStopInbox(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		fail error
		held string // SQL condition the head row must meet afterwards
	}{
		{"dead head", core.Permanent(errors.New("malformed")), "dead_at IS NOT NULL"},
		{"backing off head", errors.New("downstream unavailable"), "dead_at IS NULL AND next_attempt_at > now()"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 2)
			r := newReceiver(t, b, "c")
			stuck := msgs(151, func(int) string { return "stuck" })
			others := msgs(50, func(i int) string { return fmt.Sprint("k", i%7) })
			for _, batch := range [][]*message.Message{stuck, others} {
				if _, err := r.Receive(context.Background(), batch...); err != nil {
					t.Fatal(err)
				}
			}
			head := stuck[0].UUID
			p := newProcessor(t, b, inbox.ProcessorConfig{
				OrderByKey: true, BatchSize: 100, MaxAttempts: 5,
				RetryMin: time.Hour, RetryMax: time.Hour,
				Handler: func(ctx context.Context, tx pgx.Tx, m *message.Message) error {
					if m.UUID == head {
						return tc.fail
					}
					return b.apply(ctx, tx, m.UUID, m.Metadata.Get(core.MetadataPartitionKey))
				},
			})
			ctx := context.Background()
			// The first batch fails the head and holds the rest of its key.
			if _, err := p.ProcessOnce(ctx); err != nil {
				t.Fatal(err)
			}
			if got := b.count(t, `SELECT count(*) FROM `+b.table("inbox_event")+` WHERE event_id = $1 AND `+tc.held, head); got != 1 {
				t.Fatalf("the head row is not %s", tc.held)
			}
			for range 3 {
				if _, err := p.ProcessOnce(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if got := b.count(t, `SELECT count(*) FROM `+b.effect+` WHERE note <> 'stuck'`); got != len(others) {
				t.Fatalf("applied %d of the %d rows of other keys; the held key stopped the inbox", got, len(others))
			}
			if got := b.count(t, `SELECT count(*) FROM `+b.effect+` WHERE note = 'stuck'`); got != 0 {
				t.Fatalf("applied %d rows of the held key ahead of its head", got)
			}
			if n, err := p.ProcessOnce(ctx); err != nil || n != 0 {
				t.Fatalf("ProcessOnce with only held rows left = %d, %v; want 0", n, err)
			}
		})
	}
}

// A handler that swallows an SQL error and returns nil leaves the batch's
// transaction aborted. That row is charged an attempt with the reason and
// rolled back to its savepoint; the rest of the batch is applied, wherever
// the row sits in it.
func TestProcessorHandlerSwallowsSQLError(t *testing.T) {
	t.Parallel()
	for _, pos := range []int{0, 2, 4} {
		t.Run(fmt.Sprint("row ", pos), func(t *testing.T) {
			t.Parallel()
			b := setup(t, 2)
			r := newReceiver(t, b, "c")
			ms := msgs(5, func(i int) string { return fmt.Sprint("k", i) })
			if _, err := r.Receive(context.Background(), ms...); err != nil {
				t.Fatal(err)
			}
			bad := ms[pos].UUID
			var fixed bool
			p := newProcessor(t, b, inbox.ProcessorConfig{
				OrderByKey: true, MaxAttempts: 3, RetryMin: time.Millisecond, RetryMax: time.Millisecond,
				Handler: func(ctx context.Context, tx pgx.Tx, m *message.Message) error {
					if err := b.apply(ctx, tx, m.UUID, ""); err != nil {
						return err
					}
					if m.UUID == bad && !fixed {
						_, _ = tx.Exec(ctx, `SELECT 1/0`) // the error is swallowed
					}
					return nil
				},
			})
			ctx := context.Background()
			if n, err := p.ProcessOnce(ctx); err != nil || n != 5 {
				t.Fatalf("ProcessOnce = %d, %v; want 5, nil", n, err)
			}
			if got := b.effects(t); got != 4 {
				t.Fatalf("effects = %d, want 4 (the aborted row rolled back to its savepoint)", got)
			}
			var (
				attempts  int
				lastErr   string
				processed bool
			)
			if err := b.db.Pool.QueryRow(ctx, `SELECT attempts, coalesce(last_error, ''), processed FROM `+b.table("inbox_event")+` WHERE event_id = $1`, bad).Scan(&attempts, &lastErr, &processed); err != nil {
				t.Fatal(err)
			}
			if attempts != 1 || processed || !strings.Contains(lastErr, "aborted") {
				t.Fatalf("aborted row: attempts %d, processed %v, last_error %q; want 1 attempt, the reason", attempts, processed, lastErr)
			}
			fixed = true
			waitFor(t, 10*time.Second, "the fixed row to be applied", func() bool {
				if _, err := p.ProcessOnce(ctx); err != nil {
					t.Fatal(err)
				}
				return b.effects(t) == 5
			})
		})
	}
}

// Bytes the inbox cannot store unchanged (NUL anywhere in text; invalid
// UTF-8 in the partition key or in metadata, which jsonb would turn into
// U+FFFD) are refused with a permanent error before anything is written:
// nothing of the call is stored, and the caller's transaction survives.
func TestReceiverRefusesBytesItCannotStore(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	r := newReceiver(t, b, "c")
	ctx := context.Background()
	for name, mutate := range map[string]func(m *message.Message){
		"NUL in metadata value":           func(m *message.Message) { m.Metadata.Set("trace", "a\x00b") },
		"NUL in metadata key":             func(m *message.Message) { m.Metadata.Set("tr\x00ace", "a") },
		"invalid UTF-8 in metadata value": func(m *message.Message) { m.Metadata.Set("trace", "a\xffb") },
		"invalid UTF-8 in metadata key":   func(m *message.Message) { m.Metadata.Set("tr\xc3ace", "a") },
		"NUL in partition key":            func(m *message.Message) { m.Metadata.Set(core.MetadataPartitionKey, "k\x00") },
		"invalid UTF-8 in partition key":  func(m *message.Message) { m.Metadata.Set(core.MetadataPartitionKey, "k\xfe") },
	} {
		good := message.NewMessage(uuid.NewString(), []byte(`{}`))
		bad := message.NewMessage(uuid.NewString(), []byte(`{}`))
		mutate(bad)
		_, err := r.Receive(ctx, good, bad)
		if err == nil || !core.IsPermanent(err) || !errors.Is(err, inbox.ErrUnstorable) || !strings.Contains(err.Error(), bad.UUID) {
			t.Errorf("%s: Receive = %v; want a permanent ErrUnstorable naming the message", name, err)
		}
		tx, err := b.db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.ReceiveTx(ctx, tx, good, bad); !errors.Is(err, inbox.ErrUnstorable) {
			t.Errorf("%s: ReceiveTx = %v; want ErrUnstorable", name, err)
		}
		if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
			t.Errorf("%s: the caller's transaction did not survive: %v", name, err)
		}
		_ = tx.Rollback(ctx)
	}
	if got := b.count(t, `SELECT count(*) FROM `+b.table("inbox_event")); got != 0 {
		t.Fatalf("%d rows stored from refused calls", got)
	}
	// What can travel unchanged does, byte for byte: any payload bytes, and
	// metadata in any valid UTF-8.
	m := message.NewMessage(uuid.NewString(), []byte{0, 0xff, 0xfe, '\\', 'u', '0', '0', '0', '0'})
	m.Metadata.Set("héader ✓", "välue \U0001F600 \\u0000 \"quoted\" \t\n")
	m.Metadata.Set(core.MetadataPartitionKey, "ключ")
	if n, err := r.Receive(ctx, m); err != nil || n != 1 {
		t.Fatalf("Receive = %d, %v", n, err)
	}
	var got *message.Message
	p := newProcessor(t, b, inbox.ProcessorConfig{Handler: func(_ context.Context, _ pgx.Tx, msg *message.Message) error {
		got = msg
		return nil
	}})
	if _, err := p.ProcessOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got == nil || string(got.Payload) != string(m.Payload) || len(got.Metadata) != len(m.Metadata) {
		t.Fatalf("handler got %+v, want %+v", got, m)
	}
	for k, v := range m.Metadata {
		if got.Metadata[k] != v {
			t.Fatalf("metadata %q = %q, want %q", k, got.Metadata[k], v)
		}
	}
}

// Requeue and Discard refuse an id that is not a UUID before anything is
// sent (the caller's transaction survives), like outbox.Admin; ids that are
// not dead letters are ignored and the count says how many were changed.
func TestDeadLettersInvalidAndUnknownIDs(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	r := newReceiver(t, b, "c")
	ctx := context.Background()
	ms := msgs(2, nil)
	if _, err := r.Receive(ctx, ms...); err != nil {
		t.Fatal(err)
	}
	p := newProcessor(t, b, inbox.ProcessorConfig{Handler: func(_ context.Context, _ pgx.Tx, m *message.Message) error {
		return core.Permanent(errors.New("no"))
	}})
	if _, err := p.ProcessOnce(ctx); err != nil {
		t.Fatal(err)
	}
	dl := p.DeadLetters()
	for name, op := range map[string]func(tx pgx.Tx, ids ...string) (int, error){
		"RequeueTx": func(tx pgx.Tx, ids ...string) (int, error) { return dl.RequeueTx(ctx, tx, opsActor, ids...) },
		"DiscardTx": func(tx pgx.Tx, ids ...string) (int, error) { return dl.DiscardTx(ctx, tx, opsActor, ids...) },
	} {
		tx, err := b.db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := op(tx, ms[0].UUID, "not-a-uuid"); n != 0 || !errors.Is(err, core.ErrInvalidEventID) || !strings.Contains(err.Error(), "not-a-uuid") {
			t.Errorf("%s(bad id) = %d, %v; want ErrInvalidEventID naming the id", name, n, err)
		}
		if n, err := op(tx, uuid.NewString()); n != 0 || err != nil {
			t.Errorf("%s(unknown id) = %d, %v; want 0, nil", name, n, err)
		}
		if n, err := op(tx, ms[1].UUID, uuid.NewString()); n != 1 || err != nil {
			t.Errorf("%s(dead and unknown id) = %d, %v; want 1, nil", name, n, err)
		}
		if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
			t.Errorf("%s: the caller's transaction did not survive: %v", name, err)
		}
		_ = tx.Rollback(ctx)
	}
	if _, err := dl.Requeue(ctx, opsActor, "nope"); !errors.Is(err, core.ErrInvalidEventID) {
		t.Errorf("Requeue(bad id) = %v; want ErrInvalidEventID", err)
	}
	if _, err := dl.Discard(ctx, opsActor, "nope"); !errors.Is(err, core.ErrInvalidEventID) {
		t.Errorf("Discard(bad id) = %v; want ErrInvalidEventID", err)
	}
	if n, err := dl.Requeue(ctx, opsActor); n != 0 || err != nil {
		t.Errorf("Requeue() = %d, %v; want 0, nil", n, err)
	}
	if got := b.count(t, `SELECT count(*) FROM `+b.table("inbox_event")+` WHERE dead_at IS NOT NULL`); got != 2 {
		t.Fatalf("dead rows = %d, want 2 (every call above failed or rolled back)", got)
	}
}

// The hold after the claim is exact: a row is never applied while an
// earlier row of its key is outside the batch, whether that row is locked
// by another processor's batch or waits between the key's head and it.
func TestProcessorOrderByKeyHoldsBehindRowsOutsideTheBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	r := newReceiver(t, b, "c")
	ctx := context.Background()
	locked := msgs(3, func(int) string { return "locked" })
	gap := msgs(3, func(int) string { return "gap" })
	for _, ms := range [][]*message.Message{locked, gap} {
		if _, err := r.Receive(ctx, ms...); err != nil {
			t.Fatal(err)
		}
	}
	// "gap": its second row backs off while its first and third are due
	// (as after OrderByKey was turned on over an unordered backlog).
	if _, err := b.db.Pool.Exec(ctx, `UPDATE `+b.table("inbox_event")+` SET attempts = 1, next_attempt_at = now() + interval '1 hour' WHERE event_id = $1`, gap[1].UUID); err != nil {
		t.Fatal(err)
	}
	// "locked": another processor's batch holds its first row.
	other, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback(ctx) }()
	if _, err := other.Exec(ctx, `SELECT 1 FROM `+b.table("inbox_event")+` WHERE event_id = $1 FOR UPDATE`, locked[0].UUID); err != nil {
		t.Fatal(err)
	}
	var applied []string
	p := newProcessor(t, b, inbox.ProcessorConfig{OrderByKey: true, Handler: func(_ context.Context, _ pgx.Tx, m *message.Message) error {
		applied = append(applied, m.UUID)
		return nil
	}})
	if n, err := p.ProcessOnce(ctx); err != nil || n != 1 || len(applied) != 1 || applied[0] != gap[0].UUID {
		t.Fatalf("ProcessOnce = %d, %v, applied %v; want only the first row of gap (%s)", n, err, applied, gap[0].UUID)
	}
	if n, err := p.ProcessOnce(ctx); err != nil || n != 0 {
		t.Fatalf("second ProcessOnce = %d, %v; want 0", n, err)
	}
	// The other batch ends without applying its row: the key flows.
	if err := other.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	applied = nil
	if n, err := p.ProcessOnce(ctx); err != nil || n != 3 {
		t.Fatalf("ProcessOnce after the lock = %d, %v; want 3", n, err)
	}
	for i, m := range locked {
		if applied[i] != m.UUID {
			t.Fatalf("applied %v, want key locked in order", applied)
		}
	}
}

// Dead letters list with core.ListParams, as outbox.Admin does: pages
// by AfterID, filters by topic and key, refuses negative values.
func TestDeadLettersListParams(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	r := newReceiver(t, b, "c")
	ctx := context.Background()
	ms := msgs(5, func(i int) string { return fmt.Sprint("k", i%2) })
	if _, err := r.Receive(ctx, ms...); err != nil {
		t.Fatal(err)
	}
	p := newProcessor(t, b, inbox.ProcessorConfig{Handler: func(context.Context, pgx.Tx, *message.Message) error {
		return core.Permanent(errors.New("no"))
	}})
	if _, err := p.ProcessOnce(ctx); err != nil {
		t.Fatal(err)
	}
	// Topics are what the subscriber saw; set two of them here.
	if _, err := b.db.Pool.Exec(ctx, `UPDATE `+b.table("inbox_event")+` SET topic = CASE WHEN event_id = $1 THEN 'payments' ELSE 'orders' END`, ms[4].UUID); err != nil {
		t.Fatal(err)
	}
	dl := p.DeadLetters()
	ids := func(ds []inbox.DeadLetter) (out []string) {
		for _, d := range ds {
			out = append(out, d.EventID)
		}
		return out
	}
	page1, err := dl.List(ctx, core.ListParams{Limit: 2})
	if err != nil || fmt.Sprint(ids(page1)) != fmt.Sprint([]string{ms[0].UUID, ms[1].UUID}) {
		t.Fatalf("page 1 = %v, %v", ids(page1), err)
	}
	page2, err := dl.List(ctx, core.ListParams{Limit: 2, AfterID: page1[1].ID})
	if err != nil || fmt.Sprint(ids(page2)) != fmt.Sprint([]string{ms[2].UUID, ms[3].UUID}) {
		t.Fatalf("page 2 = %v, %v", ids(page2), err)
	}
	page3, err := dl.List(ctx, core.ListParams{Limit: 2, AfterID: page2[1].ID})
	if err != nil || fmt.Sprint(ids(page3)) != fmt.Sprint([]string{ms[4].UUID}) {
		t.Fatalf("page 3 = %v, %v", ids(page3), err)
	}
	if got, err := dl.List(ctx, core.ListParams{Topic: "payments"}); err != nil || len(got) != 1 || got[0].EventID != ms[4].UUID || got[0].Topic != "payments" {
		t.Fatalf("by topic = %+v, %v", got, err)
	}
	if got, err := dl.List(ctx, core.ListParams{PartitionKey: "k1"}); err != nil || fmt.Sprint(ids(got)) != fmt.Sprint([]string{ms[1].UUID, ms[3].UUID}) {
		t.Fatalf("by key = %v, %v", ids(got), err)
	}
	if got, err := dl.List(ctx, core.ListParams{Topic: "payments", PartitionKey: "k1"}); err != nil || len(got) != 0 {
		t.Fatalf("by topic and key = %v, %v", ids(got), err)
	}
	tx, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if got, err := dl.ListTx(ctx, tx, core.ListParams{}); err != nil || len(got) != 5 {
		t.Fatalf("ListTx = %d, %v; want all 5 (default limit)", len(got), err)
	}
	for _, bad := range []core.ListParams{{Limit: -1}, {AfterID: -1}} {
		if _, err := dl.List(ctx, bad); !errors.Is(err, core.ErrInvalidListParams) {
			t.Fatalf("List(%+v) = %v, want ErrInvalidListParams", bad, err)
		}
	}
}

// Every inbox constructor wraps core.ErrConfig (core.ErrConfig is the
// same value), also for a schema or consumer name the tables cannot hold.
func TestConfigErrorsWrapMillraceErrConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	h := func(context.Context, pgx.Tx, *message.Message) error { return nil }
	for name, err := range map[string]error{
		"receiver bad schema":   second(inbox.NewReceiver(b.db.Pool, inbox.ReceiverConfig{Schema: "Bad-Schema", Consumer: "c"})),
		"receiver NUL consumer": second(inbox.NewReceiver(b.db.Pool, inbox.ReceiverConfig{Consumer: "c\x00"})),
		"receiver UTF-8":        second(inbox.NewReceiver(b.db.Pool, inbox.ReceiverConfig{Consumer: "c\xff"})),
		"processor consumer":    second(inbox.NewProcessor(b.db.Pool, inbox.ProcessorConfig{Consumer: "c\x00", Handler: h})),
		"processor retry":       second(inbox.NewProcessor(b.db.Pool, inbox.ProcessorConfig{Consumer: "c", Handler: h, RetryMin: time.Minute, RetryMax: time.Second})),
		"dead letters":          second(inbox.NewDeadLetters(b.db.Pool, inbox.DeadLetterConfig{Consumer: "c\x00"})),
		"dedup schema":          second(inbox.NewDeduplicator(b.db.Pool, inbox.DedupConfig{Schema: "Bad-Schema", Consumer: "c"})),
	} {
		if !errors.Is(err, core.ErrConfig) || !errors.Is(err, core.ErrConfig) {
			t.Errorf("%s: %v, want core.ErrConfig", name, err)
		}
	}
}

func second[T any](_ T, err error) error { return err }

// Per-key order holds with three processors, random transient failures
// and a dead letter requeued mid-run: for every key the committed effects,
// in commit order, are its messages in arrival order, each once.
func TestProcessorOrderByKeyThreeProcessorsRandomFailures(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	ctx := context.Background()
	if _, err := b.db.Pool.Exec(ctx, `ALTER TABLE `+b.effect+` ADD COLUMN seq bigserial`); err != nil {
		t.Fatal(err)
	}
	r := newReceiver(t, b, "c")
	const keys, perKey = 30, 40
	all := msgs(keys*perKey, func(i int) string { return fmt.Sprint("k", i%keys) })
	for i := 0; i < len(all); i += 200 {
		if _, err := r.Receive(ctx, all[i:i+200]...); err != nil {
			t.Fatal(err)
		}
	}
	dead := all[5*keys+7].UUID // key k7, its sixth row: dead at its first try
	var tries sync.Map
	handler := func(ctx context.Context, tx pgx.Tx, m *message.Message) error {
		n, _ := tries.LoadOrStore(m.UUID, new(atomic.Int32))
		try := n.(*atomic.Int32).Add(1)
		if m.UUID == dead && try == 1 {
			return core.Permanent(errors.New("bad until requeued"))
		}
		if rand.IntN(5) == 0 {
			return errors.New("transient")
		}
		return b.apply(ctx, tx, m.UUID, m.Metadata.Get(core.MetadataPartitionKey))
	}
	cfg := inbox.ProcessorConfig{Handler: handler, OrderByKey: true, BatchSize: 25, RetryMin: time.Millisecond, RetryMax: 2 * time.Millisecond, MaxAttempts: 1000}
	var ps []*inbox.Processor
	for range 3 {
		p := newProcessor(t, b, cfg)
		ps = append(ps, p)
		run(t, p)
	}
	waitFor(t, 60*time.Second, "every key but k7 to drain", func() bool {
		return b.effects(t) == keys*perKey-(perKey-5)
	})
	if got := b.count(t, `SELECT count(*) FROM `+b.effect+` WHERE note = 'k7'`); got != 5 {
		t.Fatalf("key k7 applied %d rows while its sixth was dead; want 5", got)
	}
	if n, err := ps[0].DeadLetters().Requeue(ctx, opsActor, dead); err != nil || n != 1 {
		t.Fatalf("Requeue = %d, %v", n, err)
	}
	waitFor(t, 60*time.Second, "k7 to drain", func() bool { return b.effects(t) == keys*perKey })
	rows, err := b.db.Pool.Query(ctx, `SELECT note, event_id FROM `+b.effect+` ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for rows.Next() {
		var k, id string
		if err := rows.Scan(&k, &id); err != nil {
			t.Fatal(err)
		}
		got[k] = append(got[k], id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for k := range keys {
		key := fmt.Sprint("k", k)
		var want []string
		for i := k; i < len(all); i += keys {
			want = append(want, all[i].UUID)
		}
		if fmt.Sprint(got[key]) != fmt.Sprint(want) {
			t.Fatalf("key %s: effects in commit order\n%v\nwant arrival order\n%v", key, got[key], want)
		}
	}
}

// A handler that panics with a result set open (its rows not closed) leaves
// the batch's connection busy: the row cannot be rolled back to its
// savepoint there. The row is still charged an attempt, with the reason,
// and dead-lettered after MaxAttempts; the other rows are applied. (The
// rollback to the savepoint failed with "conn busy", the whole batch
// rolled back every time, the row was never charged and the good rows
// never ran.)
func TestProcessorHandlerPanicWithAResultSetOpen(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	r := newReceiver(t, b, "c")
	ms := msgs(5, func(i int) string { return fmt.Sprint("k", i) })
	if _, err := r.Receive(context.Background(), ms...); err != nil {
		t.Fatal(err)
	}
	bad := ms[1].UUID
	p := newProcessor(t, b, inbox.ProcessorConfig{
		MaxAttempts: 2, RetryMin: time.Millisecond, RetryMax: time.Millisecond,
		Handler: func(ctx context.Context, tx pgx.Tx, m *message.Message) error {
			if m.UUID == bad {
				rows, err := tx.Query(ctx, `SELECT generate_series(1, 100000)`)
				if err != nil {
					return err
				}
				rows.Next()
				panic("boom")
			}
			return b.apply(ctx, tx, m.UUID, "")
		},
	})
	ctx := context.Background()
	waitFor(t, 30*time.Second, "the good rows applied and the bad one dead-lettered", func() bool {
		if _, err := p.ProcessOnce(ctx); err != nil {
			t.Logf("ProcessOnce: %v", err)
		}
		var dead bool
		if err := b.db.Pool.QueryRow(ctx, `SELECT dead_at IS NOT NULL FROM `+b.table("inbox_event")+` WHERE event_id = $1`, bad).Scan(&dead); err != nil {
			t.Fatal(err)
		}
		return dead && b.effects(t) == 4
	})
	var (
		attempts int
		lastErr  string
	)
	if err := b.db.Pool.QueryRow(ctx, `SELECT attempts, coalesce(last_error, '') FROM `+b.table("inbox_event")+` WHERE event_id = $1`, bad).Scan(&attempts, &lastErr); err != nil {
		t.Fatal(err)
	}
	if attempts != 2 || !strings.Contains(lastErr, "panicked") {
		t.Fatalf("the row whose handler panicked: attempts %d, last_error %q; want 2, the panic", attempts, lastErr)
	}
}
