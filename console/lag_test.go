package console_test

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/saga"
)

// The consumer-lag page reads the groups from Kafka: a group that took
// one of three records written an hour ago and has no member left is
// listed first, stalled, held by nobody; a group that consumed
// everything is listed only with ?all=1.
func TestLagPage(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic, dead, done := kafkatest.Topic(), kafkatest.Group(), kafkatest.Group()
	kafkatest.CreateTopic(t, brokers, topic, 1, nil)
	hourAgo := time.Now().Add(-time.Hour)
	kafkatest.ProduceAt(t, brokers, topic, 0, hourAgo, hourAgo.Add(time.Second), hourAgo.Add(2*time.Second))
	kafkatest.CommitOffset(t, brokers, dead, topic, 0, 1)
	kafkatest.CommitOffset(t, brokers, done, topic, 0, 3)

	r := setup(t, console.Config{}).get("/kafka/lag")
	contains(t, "lag page without brokers", r.body, `id="no-brokers"`, "Consumer lag")

	b := setup(t, console.Config{KafkaBrokers: brokers})
	r = b.get("/kafka/lag")
	if r.status != http.StatusOK {
		t.Fatalf("GET /kafka/lag: %d\n%s", r.status, r.body)
	}
	row := regexp.MustCompile(`<tr data-group="` + dead + `" data-topic="` + topic + `" data-partition="0" class="stalled">\s*<td>` + dead + `</td><td>` + topic + `</td><td>0</td>\s*<td>1</td><td>3</td><td><b>2</b></td>\s*<td><span class="err">nobody</span></td>\s*<td>(59m|1h)`)
	if !row.MatchString(r.body) {
		t.Fatalf("no stalled row for the dead group:\n%s", r.body)
	}
	if regexp.MustCompile(`data-group="` + done + `"`).MatchString(r.body) {
		t.Fatalf("the group without lag listed without ?all=1:\n%s", r.body)
	}
	r = b.get("/kafka/lag?all=1")
	if !regexp.MustCompile(`<tr data-group="` + done + `" data-topic="` + topic + `" data-partition="0">`).MatchString(r.body) {
		t.Fatalf("the group without lag not listed with ?all=1:\n%s", r.body)
	}
}

// A saga whose current step's command sits on a partition nobody consumes
// says so on its page; once the group caught up, it does not.
func TestSagaPageSaysItsCommandIsNotConsumed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := kafkatest.Brokers(t)
	topic, group := kafkatest.Topic(), kafkatest.Group()
	kafkatest.CreateTopic(t, brokers, topic, 1, nil)
	db := pgtest.New(t)
	o := opstest.NewOrchestrator(t, db)
	def, err := saga.Define(saga.Spec[opstest.Order]{Type: "pay", Version: 1, Steps: []saga.Step[opstest.Order]{
		{Name: "charge", Kind: saga.Compensatable, Action: &saga.Command[opstest.Order]{Topic: topic}, Compensation: &saga.Command[opstest.Order]{}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Register(def); err != nil {
		t.Fatal(err)
	}
	if _, err := saga.Start(ctx, o, def, "pay-1", opstest.Order{ID: "pay-1"}); err != nil {
		t.Fatal(err)
	}
	hourAgo := time.Now().Add(-time.Hour)
	kafkatest.ProduceAt(t, brokers, topic, 0, hourAgo, hourAgo.Add(time.Second), hourAgo.Add(2*time.Second))
	commit := func(at int64) { kafkatest.CommitOffset(t, brokers, group, topic, 0, at) }
	commit(1)
	b := setupOn(t, db, console.Config{Sagas: o, KafkaBrokers: brokers})
	r := b.get("/saga?id=pay-1")
	contains(t, "saga page, its partition stalled", r.body, `id="saga-stalled"`, "Step <b>charge</b> waits for a reply to its command on "+topic+", partition 0: group "+group,
		"2 records waiting, held by no member")
	commit(3)
	if r := b.get("/saga?id=pay-1"); strings.Contains(r.body, `id="saga-stalled"`) {
		t.Fatalf("the hint stays once the group consumed everything:\n%s", r.body)
	}
}
