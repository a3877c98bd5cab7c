package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
)

// Dead letters in bulk: the dry run counts and lists what a query selects
// (topic, key, error match, age) and changes nothing; RequeueMatching and
// DiscardMatching act on exactly those, of this consumer only, and count
// them; the others stay dead as they were.
func TestDeadLettersInBulk(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	ctx := context.Background()
	// Six dead letters of consumer c: 0-2 timed out, 3-5 malformed; 4 and
	// 5 came from topic payments, the rest from orders; 5 died an hour ago.
	// Consumer other has the same six: nothing here may touch them.
	ms := map[string][]*message.Message{}
	for _, consumer := range []string{"c", "other"} {
		ms[consumer] = msgs(6, func(i int) string { return fmt.Sprint("k", i%2) })
		if _, err := newReceiver(t, b, consumer).Receive(ctx, ms[consumer]...); err != nil {
			t.Fatal(err)
		}
		p := newProcessor(t, b, inbox.ProcessorConfig{Consumer: consumer, BatchSize: 10,
			Handler: func(_ context.Context, _ pgx.Tx, m *message.Message) error {
				i := slices.IndexFunc(ms[consumer], func(x *message.Message) bool { return x.UUID == m.UUID })
				if i < 3 {
					return core.Permanent(fmt.Errorf("payments: timeout after %ds", i+1))
				}
				return core.Permanent(errors.New("malformed order"))
			}})
		if _, err := p.ProcessOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.db.Pool.Exec(ctx, `UPDATE `+b.table("inbox_event")+`
   SET topic = CASE WHEN event_id = ANY($1::uuid[]) THEN 'payments' ELSE 'orders' END,
       dead_at = CASE WHEN event_id = ANY($2::uuid[]) THEN dead_at - interval '1 hour' ELSE dead_at END`,
		[]string{ms["c"][4].UUID, ms["c"][5].UUID, ms["other"][4].UUID, ms["other"][5].UUID},
		[]string{ms["c"][5].UUID, ms["other"][5].UUID}); err != nil {
		t.Fatal(err)
	}
	dl, err := inbox.NewDeadLetters(b.db.Pool, inbox.DeadLetterConfig{Schema: b.db.Schema, Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	dead := func(consumer string) []string {
		t.Helper()
		d, err := inbox.NewDeadLetters(b.db.Pool, inbox.DeadLetterConfig{Schema: b.db.Schema, Consumer: consumer})
		if err != nil {
			t.Fatal(err)
		}
		list, err := d.List(ctx, core.ListParams{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range list {
			out = append(out, e.EventID)
		}
		return out
	}
	ids := func(consumer string, is ...int) []string {
		var out []string
		for _, i := range is {
			out = append(out, ms[consumer][i].UUID)
		}
		return out
	}
	halfHourAgo := time.Now().Add(-30 * time.Minute)
	for _, c := range []struct {
		q    core.DeadLetterQuery
		want []string
	}{
		{core.DeadLetterQuery{}, ids("c", 0, 1, 2, 3, 4, 5)},
		{core.DeadLetterQuery{Topic: "payments"}, ids("c", 4, 5)},
		{core.DeadLetterQuery{PartitionKey: "k1"}, ids("c", 1, 3, 5)},
		{core.DeadLetterQuery{Error: "%timeout%"}, ids("c", 0, 1, 2)},
		{core.DeadLetterQuery{Error: "payments: timeout after _s"}, ids("c", 0, 1, 2)},
		{core.DeadLetterQuery{Error: "timeout%"}, nil}, // the whole error must match
		{core.DeadLetterQuery{Topic: "payments", Error: "malformed%"}, ids("c", 4, 5)},
		{core.DeadLetterQuery{DeadBefore: halfHourAgo}, ids("c", 5)},
		{core.DeadLetterQuery{Topic: "orders", DeadBefore: halfHourAgo}, nil},
		{core.DeadLetterQuery{EventID: ms["c"][4].UUID}, ids("c", 4)},
		{core.DeadLetterQuery{Topic: "orders", EventID: ms["c"][4].UUID}, nil},
	} {
		d, err := dl.DryRun(ctx, c.q, 2)
		if err != nil {
			t.Fatal(err)
		}
		var first []string
		for _, e := range d.First {
			first = append(first, e.EventID)
		}
		if d.Count != len(c.want) || !slices.Equal(first, c.want[:min(2, len(c.want))]) {
			t.Errorf("dry run %+v: %d, first %v; want %d, first %v", c.q, d.Count, first, len(c.want), c.want[:min(2, len(c.want))])
		}
	}
	if got := dead("c"); len(got) != 6 {
		t.Fatalf("the dry runs changed the dead letters: %v", got)
	}
	if n, err := dl.RequeueMatching(ctx, core.DeadLetterQuery{Error: "%timeout%"}, opsActor); err != nil || n != 3 {
		t.Fatalf("requeue matching: %d, %v; want 3", n, err)
	}
	if got := dead("c"); !slices.Equal(got, ids("c", 3, 4, 5)) {
		t.Errorf("after requeueing the timeouts, dead %v; want %v", got, ids("c", 3, 4, 5))
	}
	var attempts int
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+b.table("inbox_event")+
		` WHERE consumer = 'c' AND attempts = 0 AND dead_at IS NULL AND NOT processed`).Scan(&attempts); err != nil || attempts != 3 {
		t.Errorf("requeued rows with a fresh start: %d, %v; want 3", attempts, err)
	}
	if n, err := dl.DiscardMatching(ctx, core.DeadLetterQuery{Topic: "payments", DeadBefore: halfHourAgo}, opsActor); err != nil || n != 1 {
		t.Fatalf("discard matching: %d, %v; want 1", n, err)
	}
	if got := dead("c"); !slices.Equal(got, ids("c", 3, 4)) {
		t.Errorf("after discarding the old one, dead %v; want %v", got, ids("c", 3, 4))
	}
	if n, err := dl.DiscardMatching(ctx, core.DeadLetterQuery{Error: "%timeout%"}, opsActor); err != nil || n != 0 {
		t.Errorf("discard of what was requeued: %d, %v; want 0", n, err)
	}
	if got := dead("other"); len(got) != 6 {
		t.Errorf("the other consumer's dead letters changed: %v", got)
	}
}
