package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/millrace/millrace/internal/kafkalag"
	"github.com/millrace/millrace/internal/kafkatest"
)

// A group that consumed one of three records an hour old and lost its
// member: `kafka lag` shows the partition stalled, held by nobody, in the
// table and in --json.
func TestKafkaLag(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic, group := kafkatest.Topic(), kafkatest.Group()
	kafkatest.CreateTopic(t, brokers, topic, 1, nil)
	now := time.Now()
	kafkatest.ProduceAt(t, brokers, topic, 0, now.Add(-time.Hour), now.Add(-time.Hour+time.Second), now.Add(-time.Hour+2*time.Second))
	kafkatest.CommitOffset(t, brokers, group, topic, 0, 1)

	res := poisonRun(t, nil, brokers, "kafka", "lag", "--group", group, "--json")
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	var out struct {
		Partitions, Stalled int
		Lags                []kafkalag.Partition
	}
	if err := json.Unmarshal([]byte(res.stdout), &out); err != nil {
		t.Fatalf("%v: %s", err, res.stdout)
	}
	if out.Partitions != 1 || out.Stalled != 1 || len(out.Lags) != 1 {
		t.Fatalf("out = %+v", out)
	}
	l := out.Lags[0]
	if l.Group != group || l.Topic != topic || l.Committed != 1 || l.End != 3 || l.Lag != 2 || l.Member != "" || !l.Stalled ||
		l.OldestAge < 59*time.Minute || l.OldestAge > 61*time.Minute {
		t.Fatalf("lag = %+v", l)
	}

	res = poisonRun(t, nil, brokers, "kafka", "lag", "--group", group, "--stall-after", "2h")
	if res.code != 0 || !strings.Contains(res.stdout, "0 stalled") || strings.Contains(res.stdout, "STALLED") || !strings.Contains(res.stdout, "(none)") {
		t.Fatalf("with --stall-after 2h: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	res = poisonRun(t, nil, brokers, "kafka", "lag", "--group", group)
	if res.code != 0 || !strings.Contains(res.stdout, "STALLED") || !strings.Contains(res.stdout, "1 stalled") || !strings.Contains(res.stdout, "1 lagging") {
		t.Fatalf("table: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	// Once the group caught up, --all shows every partition and says that
	// none lags (it said "1 lagging shown").
	kafkatest.CommitOffset(t, brokers, group, topic, 0, 3)
	res = poisonRun(t, nil, brokers, "kafka", "lag", "--group", group, "--all")
	if res.code != 0 || !strings.Contains(res.stdout, "0 lagging, 0 stalled; all shown") || !strings.Contains(res.stdout, topic) {
		t.Fatalf("--all without lag: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if res := poisonRun(t, nil, nil, "kafka", "lag"); res.code != 2 || !strings.Contains(res.stderr, "KAFKA_BROKERS") {
		t.Fatalf("without brokers: exit %d: %s", res.code, res.stderr)
	}
}
