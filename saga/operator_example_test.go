package saga_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/migrations"
	"github.com/millrace/millrace/saga"
)

// An operator without the saga's definitions (the stock millrace command,
// a standalone console) records a request; the service's orchestrator
// applies it on its next timer pass.
func ExampleOrchestrator_Request() {
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

	// The service: a parcel saga waiting on its warehouse, which is down.
	parcels, err := saga.Define(saga.Spec[Trip]{
		Type: "parcel", Version: 1,
		Steps: []saga.Step[Trip]{
			{Name: "reserve", Kind: saga.Compensatable,
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
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := o.Register(parcels); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := saga.Start(ctx, o, parcels, "parcel-1", Trip{ID: "parcel-1"}); err != nil {
		fmt.Println(err)
		return
	}

	// The operator's tool: no definitions, only the database.
	op, err := saga.New(pool, saga.Config{Schema: schema})
	if err != nil {
		fmt.Println(err)
		return
	}
	in, err := op.Request(ctx, "parcel-1", saga.ActionSkip, saga.Actor{Operator: "alice", Reason: "reserved by phone"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("requested: %s by %s; saga %s at %s\n", in.Request.Action, in.Request.Operator, in.Status, in.Step)
	_, err = op.Request(ctx, "parcel-1", saga.ActionAbort, saga.Actor{Operator: "bob", Reason: "cancel"})
	fmt.Println("second request pending:", errors.Is(err, saga.ErrRequestPending))

	// The service's orchestrator (Run calls RunDue every PollInterval).
	if _, err := o.RunDue(ctx); err != nil {
		fmt.Println(err)
		return
	}
	in, err = o.Get(ctx, "parcel-1")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("applied: saga %s, step reserve %s, pending request: %v\n", in.Status, in.Steps["reserve"].Status, in.Request != nil)
	// Output:
	// requested: skip by alice; saga running at reserve
	// second request pending: true
	// applied: saga completed, step reserve skipped, pending request: false
}
