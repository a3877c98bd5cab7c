package saga_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/google/uuid"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/sagahook"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/saga"
)

// Many replies in one transaction: each applied at most once, in order per
// saga, fenced ones recorded, bad ones reported for the poison queue, and
// the outcome the same as one reply per transaction.
func TestHandleRepliesBatch(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	ctx := context.Background()
	ids := []string{"b-1", "b-2", "b-3"}
	for _, id := range ids {
		start(t, d.testBundle, def, id, 1)
	}
	ok1 := replyMsg("b-1", d.last("b-1"), core.OutcomeSuccess, "", `{"tx":"one"}`)
	bad := replyMsg("b-2", d.last("b-2"), "maybe", "", "")
	batch := []*message.Message{
		ok1,
		ok1, // the same message twice in one batch
		replyMsg("b-1", d.last("b-1"), core.OutcomeSuccess, "", ""),         // a new message, same reply: fenced
		replyMsg("b-2", d.last("b-2"), core.OutcomeFailure, "no money", ""), // b-2 compensates
		bad,
		replyMsg("nobody", d.last("b-3"), core.OutcomeSuccess, "", ""), // unknown saga
	}
	res, err := d.o.HandleReplies(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Poisoned) != 1 || !errors.Is(res.Poisoned[4], saga.ErrBadReply) || !core.IsPermanent(res.Poisoned[4]) {
		t.Fatalf("poisoned %v", res.Poisoned)
	}
	if res.Duplicates != 1 || res.Fenced != 2 {
		t.Fatalf("duplicates %d, fenced %d", res.Duplicates, res.Fenced)
	}
	if c := d.last("b-1"); c.Step != "stock" || c.Attempt != 1 {
		t.Fatalf("b-1 went on with %+v", c)
	}
	if in := d.get("b-1"); dataOf(t, in).CreditTx != "one" || !dataOf(t, in).Approved {
		t.Fatalf("b-1 data %s", in.Data)
	}
	if in := d.get("b-2"); in.Status != saga.StatusCompensated || in.LastError != "step credit failed: failure: no money" {
		t.Fatalf("b-2: %s %q", in.Status, in.LastError)
	}
	// Two replies of one saga in one batch, in order: b-1's stock and b-3's
	// credit, then again with b-3's stock reply, which comes after its
	// credit reply in the same batch.
	b3credit := d.last("b-3")
	res, err = d.o.HandleReplies(ctx, []*message.Message{
		replyMsg("b-1", d.last("b-1"), core.OutcomeSuccess, "", ""),
		replyMsg("b-3", b3credit, core.OutcomeSuccess, "", ""),
		replyMsg("b-3", cmd{Step: "stock", Op: "action", Attempt: 1}, core.OutcomeSuccess, "", ""),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Fenced != 0 {
		t.Fatalf("fenced %d", res.Fenced)
	}
	for _, id := range []string{"b-1", "b-3"} {
		if in := d.get(id); in.Status != saga.StatusCompleted {
			t.Fatalf("%s: %s", id, in.Status)
		}
	}
	// Redelivered, the whole batch is a duplicate.
	res, err = d.o.HandleReplies(ctx, batch)
	if err != nil || res.Duplicates != 5 {
		t.Fatalf("redelivery: %v, %+v", err, res)
	}
}

// End to end through Kafka with RunBatched instead of the Router.
func TestEndToEndKafkaBatched(t *testing.T) {
	t.Parallel()
	e := setupE2E(t, true)
	e.batched = true
	e.failStock = func(id string) bool { return hashFail(id, 30) }
	def := mustDefine(t, e.spec(1, 10*time.Second))
	e.start(t, def)
	const n = 100
	for i := range n {
		start(t, e.testBundle, def, "kb-"+string(rune('a'+i%26))+string(rune('a'+i/26)), i)
	}
	// A message on the reply topic that is not a reply is dead-lettered
	// with its reason; the others keep flowing.
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: e.brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	bad := message.NewMessage(uuid.NewString(), []byte(`{}`))
	bad.Metadata.Set(core.MetadataSagaID, "kb-aa")
	if err := pub.Publish(e.replyTopic, bad); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		id := "kb-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		in := e.waitStatus(id, saga.StatusCompleted, saga.StatusCompensated)
		e.checkEffects(t, in)
		if (in.Status == saga.StatusCompensated) != e.failStock(id) {
			t.Errorf("saga %s: %s (%s)", id, in.Status, in.LastError)
		}
	}
	poisoned := kafkatest.Read(t, e.brokers, e.replyTopic+".poison", 1)
	if poisoned[0].UUID != bad.UUID || !strings.Contains(poisoned[0].Metadata.Get(middleware.ReasonForPoisonedKey), "not a saga reply") {
		t.Fatalf("poisoned %s: %q", poisoned[0].UUID, poisoned[0].Metadata.Get(middleware.ReasonForPoisonedKey))
	}
}

// listSubscriber hands the messages put on its topics' channels to a
// subscriber at once, without waiting for acknowledgements (as a broker
// consumer with many partitions does), and closes them when ctx ends.
type listSubscriber struct {
	topics map[string]chan *message.Message
}

func (s listSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	src := s.topics[topic]
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for {
			select {
			case m := <-src:
				select {
				case out <- m:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

func (listSubscriber) Close() error { return nil }

// One reply that fails to apply (here a failing Hook for its saga) does
// not hold up the other replies of its batch: the batch is applied again
// one reply per transaction, and only the failing one is nacked.
func TestRunBatchedAppliesTheGoodRepliesOfAFailedBatch(t *testing.T) {
	t.Parallel()
	hook := func(ctx context.Context, p sagahook.Point, id string) error {
		if id == "bad" && p == sagahook.Loaded {
			return errors.New("injected")
		}
		return nil
	}
	b := setup(t, bundleOptions{clock: newManualClock(), hook: hook})
	def := mustDefine(t, orderSpec(b, 1))
	if err := b.o.Register(def); err != nil {
		t.Fatal(err)
	}
	d := &driver{testBundle: b}
	start(t, b, def, "good", 1)
	start(t, b, def, "bad", 1)
	good := replyMsg("good", d.last("good"), core.OutcomeSuccess, "", "")
	bad := replyMsg("bad", d.last("bad"), core.OutcomeSuccess, "", "")
	replies := make(chan *message.Message, 2)
	replies <- bad
	replies <- good
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- b.o.RunBatched(ctx, saga.BatchConfig{
			Subscriber: listSubscriber{map[string]chan *message.Message{def.ReplyTopic(): replies}},
			Poison:     b.pubsub, Workers: 1, BatchWait: 200 * time.Millisecond,
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	settled := func(msg *message.Message) string {
		select {
		case <-msg.Acked():
			return "acked"
		case <-msg.Nacked():
			return "nacked"
		case <-time.After(30 * time.Second):
			return "neither"
		}
	}
	if got := settled(good); got != "acked" {
		t.Fatalf("the good reply was %s with the bad one's batch", got)
	}
	if got := settled(bad); got != "nacked" {
		t.Fatalf("the bad reply was %s", got)
	}
	if c := d.last("good"); c.Step != "stock" {
		t.Fatalf("good went on with %+v", c)
	}
	if c := d.last("bad"); c.Step != "credit" {
		t.Fatalf("bad went on with %+v", c)
	}
}

// A reply batch's writes go out with its COMMIT: one that fails there (a
// trigger refusing one saga's command) rolls the whole batch back, its
// dedup marks and every saga's new state with it, so that the same
// replies apply when they come again.
func TestHandleRepliesWriteFailingAtCommitRollsBackTheBatch(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	ctx := context.Background()
	for _, id := range []string{"c-1", "c-2"} {
		start(t, d.testBundle, def, id, 1)
	}
	refuse := d.tbl("refuse")
	fn := d.tbl("refuse_command")
	if _, err := d.db.Pool.Exec(ctx, `CREATE TABLE `+refuse+` (id text);
CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM `+refuse+` WHERE id = NEW.aggregate_id) THEN RAISE EXCEPTION 'refused %', NEW.aggregate_id; END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refuse BEFORE INSERT ON `+d.tbl("outbox_event")+` FOR EACH ROW EXECUTE FUNCTION `+fn+`();
INSERT INTO `+refuse+` VALUES ('c-2')`); err != nil {
		t.Fatal(err)
	}
	before := map[string]cmd{"c-1": d.last("c-1"), "c-2": d.last("c-2")}
	batch := []*message.Message{
		replyMsg("c-1", before["c-1"], core.OutcomeSuccess, "", ""),
		replyMsg("c-2", before["c-2"], core.OutcomeSuccess, "", ""),
	}
	if _, err := d.o.HandleReplies(ctx, batch); err == nil || !strings.Contains(err.Error(), "refused c-2") {
		t.Fatalf("batch with a refused command: %v; want the write's error", err)
	}
	for id, c := range before {
		if got := d.last(id); got != c {
			t.Fatalf("%s went on to %+v after its batch failed; want it still at %+v", id, got, c)
		}
		if in := d.get(id); in.Status != saga.StatusRunning || in.Step != c.Step {
			t.Fatalf("%s: %s at %q after its batch failed", id, in.Status, in.Step)
		}
	}
	if _, err := d.db.Pool.Exec(ctx, `DELETE FROM `+refuse); err != nil {
		t.Fatal(err)
	}
	res, err := d.o.HandleReplies(ctx, batch)
	if err != nil || res.Duplicates != 0 {
		t.Fatalf("the same batch again: %v, %+v; want it applied, no duplicate (the marks rolled back)", err, res)
	}
	for id := range before {
		if c := d.last(id); c.Step != "stock" {
			t.Fatalf("%s: last command %+v; want stock", id, c)
		}
	}
}
