package saga_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/migrations"
	"github.com/millrace/millrace/saga"
)

// A saga paused while its warehouse is audited, then resumed; another
// started at a set time, then cancelled before it started.
func ExampleOrchestrator_Pause() {
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
	parcels, err := saga.Define(saga.Spec[Trip]{
		Type: "parcel", Version: 1,
		Steps: []saga.Step[Trip]{
			{Name: "reserve", Kind: saga.Compensatable, Timeout: time.Minute,
				Action: &saga.Command[Trip]{Topic: "warehouse"}, Compensation: &saga.Command[Trip]{}},
			{Name: "ship", Kind: saga.Pivot,
				Local: func(context.Context, pgx.Tx, *Trip) error { return nil }},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	o, err := saga.New(pool, saga.Config{Schema: schema})
	if err == nil {
		err = o.Register(parcels)
	}
	if err != nil {
		fmt.Println(err)
		return
	}

	// Pause: no next step, no timer; a reply arriving now is held.
	if _, err := saga.Start(ctx, o, parcels, "parcel-1", Trip{ID: "parcel-1"}); err != nil {
		fmt.Println(err)
		return
	}
	in, err := o.Pause(ctx, "parcel-1", saga.Actor{Operator: "alice", Reason: "warehouse audit"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("parcel-1:", in.Status, "at", in.Step)
	_, err = o.Retry(ctx, "parcel-1", saga.Actor{Operator: "bob", Reason: "nudge"})
	fmt.Println("retry while paused refused:", err != nil)
	// Resume: the step's timeout and the deadline move by the paused time,
	// held replies are applied in order.
	in, err = o.Resume(ctx, "parcel-1", saga.Actor{Operator: "alice", Reason: "audit done"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("parcel-1:", in.Status, "at", in.Step)

	// Scheduled: the row exists now, the first step runs when due.
	in, err = saga.Start(ctx, o, parcels, "parcel-2", Trip{ID: "parcel-2"}, saga.StartAt(time.Now().Add(24*time.Hour)))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("parcel-2:", in.Status)
	in, err = o.Abort(ctx, "parcel-2", saga.Actor{Operator: "alice", Reason: "customer cancelled"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("parcel-2:", in.Status, "-", in.LastError)
	// Output:
	// parcel-1: paused at reserve
	// retry while paused refused: true
	// parcel-1: running at reserve
	// parcel-2: scheduled
	// parcel-2: compensated - cancelled before its start by an operator
}
