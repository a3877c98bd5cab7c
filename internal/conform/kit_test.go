package conform_test

import (
	"context"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/conform"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/leaktest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/kafka"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// envHelper selects what TestHelperParticipant runs, in a process the kit
// starts: "good", the Go participant as millrace conform go-participant
// runs it; "nodedup", the same participant without the inbox's dedup mark.
const envHelper = "MILLRACE_CONFORM_HELPER"

// The kit passes the Go participant, and catches one that answers a
// redelivered command again, takes a record whose event id is not a
// UUID (no inbox mark) and does not answer poisoned commands: the kit's
// verdicts can fail.
func TestKit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		helper string
		fail   []string // the cases that must fail
	}{
		{"good", nil},
		// poison: an event id that is not a UUID is handled; with
		// poisoned_attempt_keeps_its_failure: HandleTx alone (no
		// RunBatched, no Handle) does not answer a poisoned command.
		{"nodedup", []string{"duplicate_delivery", "compensation_redelivered", "poison", "poisoned_attempt_keeps_its_failure"}},
	} {
		t.Run(c.helper, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			results, err := conform.RunKit(context.Background(), conform.KitConfig{
				Brokers: kafkatest.Brokers(t), Topic: kafkatest.Topic(), Pool: db.Pool, DatabaseURL: pgtest.URL(),
				Schema: db.Schema, Run: envHelper + "=" + c.helper + " '" + os.Args[0] + "' -test.run='^TestHelperParticipant$' -test.count=1",
				Timeout: time.Minute, Log: testWriter{t},
			})
			if err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			conform.PrintResults(&out, results)
			t.Logf("kit:\n%s", out.String())
			cases, _ := conform.Cases()
			if len(results) != len(cases) {
				t.Fatalf("%d results for %d cases", len(results), len(cases))
			}
			for _, r := range results {
				want := !contains(c.fail, r.Case)
				if r.Passed() != want {
					t.Errorf("case %s passed = %t, want %t: %v", r.Case, r.Passed(), want, r.Problems)
				}
			}
		})
	}
}

// TestHelperParticipant is the participant process of TestKit: it runs
// only when the kit starts it (envHelper set), until SIGTERM.
func TestHelperParticipant(t *testing.T) {
	mode := os.Getenv(envHelper)
	if mode == "" {
		return // not a helper run
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgtest.Connect(ctx, os.Getenv("DATABASE_URL"), 8)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	schema, topic := os.Getenv("MILLRACE_SCHEMA"), os.Getenv("MILLRACE_TOPIC")
	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	if mode == "good" {
		if err := conform.RunGoParticipant(ctx, conform.GoParticipantConfig{Pool: pool, Schema: schema, Brokers: brokers, Topic: topic}); err != nil {
			t.Fatal(err)
		}
		return
	}
	// nodedup: each command in a transaction of its own, with no inbox mark.
	p, err := compensation.NewParticipant(pool, compensation.Config{Schema: schema, Name: "nodedup"})
	if err == nil {
		err = conform.Register(p, schema, conform.CrashProcess)
	}
	if err != nil {
		t.Fatal(err)
	}
	// The crash case kills a member: its partitions move on at its session
	// timeout.
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: brokers, ConsumerGroup: "nodedup-" + topic,
		SessionTimeout: 6 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	r.AddConsumerHandler("nodedup", topic, sub, func(msg *message.Message) error {
		err := pgx.BeginFunc(msg.Context(), pool, func(tx pgx.Tx) error {
			return p.HandleTx(msg.Context(), tx, msg)
		})
		if core.IsPermanent(err) {
			c := msg.Copy()
			c.Metadata.Set("reason_poisoned", err.Error())
			return pub.Publish(topic+".poison", c)
		}
		return err
	})
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
