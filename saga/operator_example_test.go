package saga_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/saga"
)

// An operator without the saga's definitions (the stock millrace command,
// a standalone console) records a request; the service's orchestrator
// applies it on its next timer pass.
func ExampleOperator() {
	ctx := context.Background()
	db, closeDB, err := pgtest.Open(ctx, 4)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer closeDB()

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
	o, err := saga.New(db.Pool, saga.Config{Schema: db.Schema})
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
	op, err := saga.NewOperator(db.Pool, saga.OperatorConfig{Schema: db.Schema})
	if err != nil {
		fmt.Println(err)
		return
	}
	in, err := op.Skip(ctx, "parcel-1", saga.Actor{Operator: "alice", Reason: "reserved by phone"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("requested: %s by %s; saga %s at %s\n", in.Request.Action, in.Request.Operator, in.Status, in.Step)
	_, err = op.Abort(ctx, "parcel-1", saga.Actor{Operator: "bob", Reason: "cancel"})
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
