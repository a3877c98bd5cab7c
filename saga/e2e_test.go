package saga_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
)

// e2e is an end-to-end rig: the orchestrator and two participants built
// with package compensation ("credit" and "stock"), talking only through
// the outbox, a relay, a transport (the Kafka protocol, or Watermill's
// GoChannel) and the inbox.
type e2e struct {
	*testBundle
	creditTopic, stockTopic, replyTopic string
	// failStock and failCredit decide whether the action refuses a saga.
	failStock, failCredit func(id string) bool
	// dropReply, when set, loses replies in transit (after the relay
	// marked them published).
	dropReply func(msg *message.Message) bool
	kafka     bool
	brokers   []string
	// participantsOnly leaves the orchestrator out of the rig (it runs
	// elsewhere, in a child process).
	participantsOnly bool
	// batched runs the orchestrator with RunBatched instead of AddToRouter.
	batched bool
	// others are more orchestrators on the same schema, each with its own
	// subscription to the reply topic and its own timers.
	others []*saga.Orchestrator
}

type creditCmd struct {
	Order  string `json:"order"`
	Amount int    `json:"amount"`
}

func setupE2E(t testing.TB, useKafka bool) *e2e {
	t.Helper()
	b := setup(t, bundleOptions{})
	e := &e2e{testBundle: b, kafka: useKafka,
		creditTopic: kafkatest.Topic(), stockTopic: kafkatest.Topic(), replyTopic: kafkatest.Topic()}
	if useKafka {
		e.brokers = kafkatest.Brokers(t)
	}
	return e
}

func (e *e2e) spec(version int, timeout time.Duration) saga.Spec[order] {
	return saga.Spec[order]{
		Type: "order", Version: version, ReplyTopic: e.replyTopic,
		Steps: []saga.Step[order]{
			{
				Name: "credit", Kind: saga.Compensatable, Timeout: timeout,
				Action: &saga.Command[order]{Topic: e.creditTopic, Payload: func(o order) (any, error) {
					return creditCmd{Order: o.ID, Amount: o.Amount}, nil
				}},
				OnSuccess: saga.Reply(func(o *order, r struct {
					Tx string `json:"tx"`
				}) error {
					o.CreditTx = r.Tx
					return nil
				}),
				Compensation: &saga.Command[order]{},
			},
			{
				Name: "approve", Kind: saga.Compensatable,
				Local: func(ctx context.Context, tx pgx.Tx, o *order) error {
					o.Approved = true
					return e.effect(ctx, tx, o.ID, "approve", "do")
				},
				LocalCompensation: func(ctx context.Context, tx pgx.Tx, o *order) error {
					o.Approved = false
					return e.effect(ctx, tx, o.ID, "approve", "undo")
				},
			},
			{
				Name: "stock", Kind: saga.Compensatable, Timeout: timeout,
				Action:       &saga.Command[order]{Topic: e.stockTopic},
				Compensation: &saga.Command[order]{},
			},
		},
	}
}

func (e *e2e) effect(ctx context.Context, tx pgx.Tx, id, step, what string) error {
	_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (saga_id, step, what) VALUES ($1, $2, $3)`, e.tbl("test_effect")), id, step, what)
	return err
}

// participants builds the credit and stock participants.
func (e *e2e) participants(t testing.TB) (credit, stock *compensation.Participant) {
	t.Helper()
	var err error
	credit, err = compensation.NewParticipant(e.db.Pool, compensation.Config{Schema: e.db.Schema, Name: "payments", Writer: e.w})
	if err != nil {
		t.Fatal(err)
	}
	err = compensation.Register(credit, "credit",
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, c creditCmd) (map[string]string, error) {
			if e.failCredit != nil && e.failCredit(call.SagaID) {
				return nil, compensation.Fail("insufficient credit")
			}
			return map[string]string{"tx": "credit-" + c.Order}, e.effect(ctx, tx, call.SagaID, "credit", "do")
		},
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, c creditCmd) error {
			return e.effect(ctx, tx, call.SagaID, "credit", "undo")
		})
	if err != nil {
		t.Fatal(err)
	}
	stock, err = compensation.NewParticipant(e.db.Pool, compensation.Config{Schema: e.db.Schema, Name: "inventory", Writer: e.w})
	if err != nil {
		t.Fatal(err)
	}
	err = compensation.Register(stock, "stock",
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, o order) (struct{}, error) {
			if e.failStock != nil && e.failStock(call.SagaID) {
				return struct{}{}, compensation.Fail("out of stock")
			}
			return struct{}{}, e.effect(ctx, tx, call.SagaID, "stock", "do")
		},
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, o order) error {
			return e.effect(ctx, tx, call.SagaID, "stock", "undo")
		})
	if err != nil {
		t.Fatal(err)
	}
	return credit, stock
}

// dropping is a publisher that loses the messages drop selects.
type dropping struct {
	message.Publisher
	drop func(msg *message.Message) bool
}

func (p dropping) Publish(topic string, msgs ...*message.Message) error {
	keep := msgs[:0:0]
	for _, m := range msgs {
		if !p.drop(m) {
			keep = append(keep, m)
		}
	}
	if len(keep) == 0 {
		return nil
	}
	return p.Publisher.Publish(topic, keep...)
}

// start wires everything and runs it until the test ends.
func (e *e2e) start(t testing.TB, defs ...saga.Registrable) {
	t.Helper()
	if err := e.o.Register(defs...); err != nil {
		t.Fatal(err)
	}
	var pub message.Publisher = e.pubsub
	subscriber := func() message.Subscriber { return e.pubsub }
	if e.kafka {
		kp, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: e.brokers}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = kp.Close() })
		pub = kp
		subscriber = func() message.Subscriber { return kafkatest.NewSubscriber(t, e.brokers) }
	}
	retry := &middleware.Retry{MaxRetries: 50, InitialInterval: time.Millisecond, MaxInterval: 20 * time.Millisecond, ShouldRetry: inbox.ShouldRetry}
	if !e.participantsOnly && !e.batched {
		if _, err := e.o.AddToRouter(e.router, saga.RouterConfig{Subscriber: subscriber(), Poison: pub, Retry: retry}); err != nil {
			t.Fatal(err)
		}
	}
	for i, o := range e.others {
		if err := o.Register(defs...); err != nil {
			t.Fatal(err)
		}
		h := e.router.AddConsumerHandler(fmt.Sprintf("other-orchestrator-%d", i), e.replyTopic, subscriber(), o.Handler())
		h.AddMiddleware(retry.Middleware)
	}
	credit, stock := e.participants(t)
	for _, p := range []struct {
		p     *compensation.Participant
		topic string
	}{{credit, e.creditTopic}, {stock, e.stockTopic}} {
		if _, err := p.p.AddToRouter(e.router, compensation.RouterConfig{Topic: p.topic, Subscriber: subscriber(), Poison: pub, Retry: retry}); err != nil {
			t.Fatal(err)
		}
	}
	relayPub := pub
	if e.dropReply != nil {
		relayPub = dropping{Publisher: pub, drop: e.dropReply}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := e.router.Run(ctx); err != nil {
			t.Error(err)
		}
	}()
	<-e.router.Running()
	relay, err := outbox.NewRelay(e.db.Pool, outbox.RelayConfig{Schema: e.db.Schema, Publisher: relayPub, PollInterval: 20 * time.Millisecond,
		Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = relay.Run(ctx) }()
	if !e.participantsOnly {
		wg.Add(1)
		go func() { defer wg.Done(); _ = e.o.Run(ctx) }()
	}
	for _, o := range e.others {
		wg.Add(1)
		go func() { defer wg.Done(); _ = o.Run(ctx) }()
	}
	if e.batched {
		sub := subscriber()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.o.RunBatched(ctx, saga.BatchConfig{Subscriber: sub, Poison: pub}); err != nil {
				t.Error(err)
			}
		}()
	}
	t.Cleanup(func() {
		cancel()
		_ = e.router.Close()
		wg.Wait()
	})
}

// checkEffects checks that a saga's participants' effects match its
// outcome exactly: completed, each step done once and never undone;
// compensated, each step that was done undone once, after it was done.
func (e *e2e) checkEffects(t testing.TB, in *saga.Instance) {
	t.Helper()
	got := e.effects(in.ID)
	count := map[string]int{}
	for _, s := range got {
		count[s]++
	}
	for _, step := range []string{"credit", "approve", "stock"} {
		do, undo := count[step+":do"], count[step+":undo"]
		switch {
		case do > 1 || undo > 1:
			t.Errorf("saga %s: step %s applied %d times, undone %d times: %v", in.ID, step, do, undo, got)
		case in.Status == saga.StatusCompleted && (do != 1 || undo != 0):
			t.Errorf("completed saga %s: step %s: %v", in.ID, step, got)
		case in.Status == saga.StatusCompensated && do != undo:
			t.Errorf("compensated saga %s: step %s done %d, undone %d: %v", in.ID, step, do, undo, got)
		}
	}
}

func hashFail(id string, percent uint32) bool {
	h := fnv.New32a()
	h.Write([]byte(id))
	return h.Sum32()%100 < percent
}

// Through the Kafka protocol: sagas with random failures at step 3 end
// completed or compensated, with the participants' effects matching.
func TestEndToEndKafka(t *testing.T) {
	t.Parallel()
	e := setupE2E(t, true)
	e.failStock = func(id string) bool { return hashFail(id, 30) }
	def := mustDefine(t, e.spec(1, 10*time.Second))
	e.start(t, def)
	const n = 30
	for i := range n {
		start(t, e.testBundle, def, fmt.Sprintf("k-%d", i), i)
	}
	completed, compensated := 0, 0
	for i := range n {
		in := e.waitStatus(fmt.Sprintf("k-%d", i), saga.StatusCompleted, saga.StatusCompensated)
		e.checkEffects(t, in)
		if in.Status == saga.StatusCompleted {
			completed++
			if e.failStock(in.ID) {
				t.Errorf("saga %s completed but stock refused it", in.ID)
			}
		} else {
			compensated++
			if !e.failStock(in.ID) {
				t.Errorf("saga %s compensated but stock accepted it: %s", in.ID, in.LastError)
			}
		}
	}
	if completed == 0 || compensated == 0 {
		t.Fatalf("completed %d, compensated %d: the test covers both", completed, compensated)
	}
}

// A reply lost in transit: the step times out and is retried with a new
// attempt; the participant's barrier answers again without running the
// action twice. When every reply of the step is lost, the saga compensates
// it, and the participant undoes the effect once.
func TestTimeoutRetryThenCompensateEffectOnce(t *testing.T) {
	t.Parallel()
	e := setupE2E(t, false)
	var mu sync.Mutex
	dropped := map[string]int{}
	e.dropReply = func(m *message.Message) bool {
		id := m.Metadata.Get(core.MetadataSagaID)
		if m.Metadata.Get(core.MetadataSagaOutcome) == "" || m.Metadata.Get(core.MetadataSagaStep) != "stock" ||
			m.Metadata.Get(core.MetadataSagaOperation) != core.OperationAction {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		if id == "once" && dropped[id] >= 1 {
			return false
		}
		dropped[id]++
		return true
	}
	def := mustDefine(t, e.spec(1, 300*time.Millisecond))
	e.start(t, def)
	start(t, e.testBundle, def, "once", 1)
	start(t, e.testBundle, def, "always", 1)

	in := e.waitStatus("once", saga.StatusCompleted)
	e.checkEffects(t, in)
	if st := in.Steps["stock"]; st.Attempt != 2 {
		t.Fatalf("stock step %+v, want done at attempt 2", st)
	}
	in = e.waitStatus("always", saga.StatusCompensated)
	e.checkEffects(t, in)
	if got := e.effects("always"); len(got) != 6 || got[2] != "stock:do" || got[3] != "stock:undo" {
		t.Fatalf("effects %v", got)
	}
	if st := in.Steps["stock"]; st.Attempt != 3 || st.Status != saga.StepCompensated {
		t.Fatalf("stock step %+v", st)
	}
}

// 1,000 sagas at once through the Kafka protocol, with random business
// failures at steps 1 and 3 and random lost replies: every one ends
// completed or compensated, and the participants' effects match the
// outcomes exactly.
func TestThousandConcurrentSagas(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 sagas")
	}
	t.Parallel()
	e := setupE2E(t, true)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, 3))
	fails := map[string]string{}
	e.failCredit = func(id string) bool { mu.Lock(); defer mu.Unlock(); return fails[id] == "credit" }
	e.failStock = func(id string) bool { mu.Lock(); defer mu.Unlock(); return fails[id] == "stock" }
	e.dropReply = func(m *message.Message) bool {
		mu.Lock()
		defer mu.Unlock()
		return m.Metadata.Get(core.MetadataSagaOutcome) != "" && rng.IntN(100) == 0
	}
	def := mustDefine(t, e.spec(1, 10*time.Second))
	e.start(t, def)
	n := 1000
	if raceEnabled {
		n = 300
	}
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("many-%d", i)
		switch r := rng.IntN(10); {
		case r == 0:
			fails[ids[i]] = "credit"
		case r < 3:
			fails[ids[i]] = "stock"
		}
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				if _, err := saga.Start(context.Background(), e.o, def, ids[i], order{ID: ids[i], Amount: i}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var live int
		if err := e.db.Pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(*) FROM %s WHERE status NOT IN ('completed', 'compensated')`,
			e.tbl("saga_instance"))).Scan(&live); err != nil {
			t.Fatal(err)
		}
		if live == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sagas still not ended", live)
		}
		time.Sleep(100 * time.Millisecond)
	}
	byStatus := map[saga.Status]int{}
	for _, id := range ids {
		in, err := e.o.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		byStatus[in.Status]++
		e.checkEffects(t, in)
		if fails[id] != "" && in.Status != saga.StatusCompensated {
			t.Errorf("saga %s: %s, but %s refused it", id, in.Status, fails[id])
		}
	}
	t.Logf("%v", byStatus)
}

// Three orchestrators on one schema, each receiving every reply (each has
// its own subscription) and each running the timers, with lost replies so
// that timeouts fire too: every reply is applied once, every saga ends,
// and the effects match.
func TestSeveralOrchestratorsShareTheWork(t *testing.T) {
	t.Parallel()
	e := setupE2E(t, false)
	for range 2 {
		o, err := saga.New(e.db.Pool, saga.Config{Schema: e.db.Schema, Writer: e.w, PollInterval: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		e.others = append(e.others, o)
	}
	e.failStock = func(id string) bool { return hashFail(id, 30) }
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 4))
	e.dropReply = func(m *message.Message) bool {
		mu.Lock()
		defer mu.Unlock()
		return m.Metadata.Get(core.MetadataSagaOutcome) != "" && rng.IntN(10) == 0
	}
	def := mustDefine(t, e.spec(1, 300*time.Millisecond))
	e.start(t, def)
	const n = 60
	for i := range n {
		start(t, e.testBundle, def, fmt.Sprintf("multi-%d", i), i)
	}
	for i := range n {
		id := fmt.Sprintf("multi-%d", i)
		in := e.waitStatus(id, saga.StatusCompleted, saga.StatusCompensated)
		e.checkEffects(t, in)
		applied := map[string]bool{}
		for _, h := range historyOf(t, e.o, id) {
			if h.Event != "reply" {
				continue
			}
			k := fmt.Sprintf("%s/%s/%d", h.Step, h.Operation, h.Attempt)
			if applied[k] {
				t.Errorf("saga %s: reply %s applied twice", id, k)
			}
			applied[k] = true
		}
	}
}
