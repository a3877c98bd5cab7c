package saga_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/migrations"
	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
)

// Trip is the example saga's data.
type Trip struct {
	ID     string `json:"id"`
	Hotel  string `json:"hotel"`
	Booked string `json:"booked,omitempty"`
	Paid   bool   `json:"paid"`
}

// A two-step saga: book a hotel (a remote step, with a participant built
// with package compensation), then take the payment (a local step, the
// pivot). Commands and replies go through the outbox and a relay; here
// the transport is Watermill's in-process GoChannel, in production Kafka.
func Example() {
	ctx := context.Background()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	// A schema of its own, dropped at the end.
	schema := fmt.Sprintf("example_%08x", rand.Uint32())
	defer pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE") //nolint:errcheck
	m, err := migrations.New(pool, migrations.Config{Schema: schema})
	if err == nil {
		_, err = m.Up(ctx) // millrace's tables
	}
	if err != nil {
		fmt.Println(err)
		return
	}

	trips, err := saga.Define(saga.Spec[Trip]{
		Type: "trip", Version: 1,
		Steps: []saga.Step[Trip]{
			{
				Name: "hotel", Kind: saga.Compensatable,
				Action: &saga.Command[Trip]{Topic: "hotels", Name: "book-hotel",
					Payload: func(t Trip) (any, error) { return map[string]string{"hotel": t.Hotel}, nil }},
				OnSuccess: saga.Reply(func(t *Trip, r struct {
					Room string `json:"room"`
				}) error {
					t.Booked = r.Room
					return nil
				}),
				Compensation: &saga.Command[Trip]{}, // same topic and command, operation "compensation"
			},
			{
				Name: "pay", Kind: saga.Pivot,
				Local: func(ctx context.Context, tx pgx.Tx, t *Trip) error { t.Paid = true; return nil },
			},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	o, err := saga.New(pool, saga.Config{Schema: schema})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := o.Register(trips); err != nil {
		fmt.Println(err)
		return
	}

	// The hotel service: books a room, and cancels it as compensation.
	hotels, err := compensation.NewParticipant(pool, compensation.Config{Schema: schema, Name: "hotels"})
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = compensation.Register(hotels, "book-hotel",
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, cmd struct{ Hotel string }) (map[string]string, error) {
			return map[string]string{"room": cmd.Hotel + "-101"}, nil
		},
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, cmd struct{ Hotel string }) error {
			return nil
		})

	pubsub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer pubsub.Close()
	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if _, err := o.AddToRouter(router, saga.RouterConfig{Subscriber: pubsub, Poison: pubsub}); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := hotels.AddToRouter(router, compensation.RouterConfig{Topic: "hotels", Subscriber: pubsub, Poison: pubsub}); err != nil {
		fmt.Println(err)
		return
	}
	relay, _ := outbox.NewRelay(pool, outbox.RelayConfig{Schema: schema, Publisher: pubsub})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{}, 3)
	go func() { _ = router.Run(runCtx); done <- struct{}{} }()
	<-router.Running()
	go func() { _ = relay.Run(runCtx); done <- struct{}{} }()
	go func() { _ = o.Run(runCtx); done <- struct{}{} }()
	defer func() {
		stop()
		_ = router.Close()
		for range 3 {
			<-done
		}
	}()

	// Start the saga in the business transaction.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... INSERT INTO trips ...
		_, err := saga.StartTx(ctx, tx, o, trips, "trip-1", Trip{ID: "trip-1", Hotel: "ritz"})
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		in, err := o.Get(ctx, "trip-1")
		if err != nil {
			fmt.Println(err)
			return
		}
		if in.Status == saga.StatusCompleted {
			fmt.Println(in.Status, in.Steps["hotel"].Status, in.Steps["pay"].Status)
			break
		}
	}
	history, _ := o.History(ctx, "trip-1")
	for _, h := range history {
		fmt.Println(strings.TrimSpace(strings.Join([]string{h.Event, h.Step, h.Operation, h.Outcome}, " ")))
	}
	// Output:
	// completed done done
	// started
	// command hotel action
	// reply hotel action success
	// step_done hotel action success
	// step_done pay action success
	// completed
}
