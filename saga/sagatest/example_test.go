package sagatest_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/saga"
	"github.com/millrace/millrace/saga/sagatest"
)

// Parcel is the example saga's data.
type Parcel struct {
	ID string `json:"id"`
}

// A user's test of a three-step saga (reserve credit, reserve stock, ship)
// whose stock participant answers too late once: its first reply arrives
// after the step's one-minute timeout and the backoff after it. The saga
// sends the command again (attempt 2); the late reply of attempt 1 is the
// step's answer (the barrier answers every attempt alike), the barrier
// answers attempt 2 with the same outcome without reserving twice, that
// reply is fenced, and the saga completes. The harness runs the real
// definition, the real participants and the real relay on a fresh schema,
// skips the minute, and checks every invariant. In a test:
// h := sagatest.New(t, cfg) and h.Run(t).
func Example() {
	ctx := context.Background()
	h, err := sagatest.Open(ctx, sagatest.Config{
		Faults: sagatest.Script(sagatest.DelayFor(2, sagatest.Event{Kind: sagatest.Reply, Step: "stock"})),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer h.Close()

	// The participants, built with package compensation: each keeps a row
	// per reservation.
	if _, err := h.Pool().Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (parcel text, what text)`, h.Table("reservation"))); err != nil {
		fmt.Println(err)
		return
	}
	for _, what := range []string{"credit", "stock", "ship"} {
		p, err := h.NewParticipant(what)
		if err != nil {
			fmt.Println(err)
			return
		}
		err = compensation.Register(p, what,
			func(ctx context.Context, tx pgx.Tx, _ compensation.Call, c Parcel) (struct{}, error) {
				_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s VALUES ($1, $2)`, h.Table("reservation")), c.ID, what)
				return struct{}{}, err
			},
			func(ctx context.Context, tx pgx.Tx, _ compensation.Call, c Parcel) error {
				_, err := tx.Exec(ctx, fmt.Sprintf(`DELETE FROM %s WHERE parcel = $1 AND what = $2`, h.Table("reservation")), c.ID, what)
				return err
			})
		if err != nil {
			fmt.Println(err)
			return
		}
		if err := h.AddParticipant(p, what); err != nil {
			fmt.Println(err)
			return
		}
	}

	// The saga under test.
	step := func(name string, kind saga.Kind) saga.Step[Parcel] {
		s := saga.Step[Parcel]{Name: name, Kind: kind, Timeout: time.Minute, Action: &saga.Command[Parcel]{Topic: name}}
		if kind == saga.Compensatable {
			s.Compensation = &saga.Command[Parcel]{}
		}
		return s
	}
	def, err := saga.Define(saga.Spec[Parcel]{Type: "parcel", Version: 1, Steps: []saga.Step[Parcel]{
		step("credit", saga.Compensatable), step("stock", saga.Compensatable), step("ship", saga.Pivot),
	}})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := h.Register(def); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := saga.Start(ctx, h.Orchestrator(), def, "parcel-1", Parcel{ID: "parcel-1"}); err != nil {
		fmt.Println(err)
		return
	}

	report := h.RunE()
	fmt.Println("violations:", report.Err())
	fmt.Println("faults:", report.Faults)
	fmt.Println("time skipped:", report.Elapsed)
	in, err := h.Get("parcel-1")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("saga:", in.Status)
	hist, err := h.History("parcel-1")
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range hist {
		if e.Step == "stock" && e.Event != "step_done" {
			fmt.Println(strings.TrimSpace(fmt.Sprintf("  %s %s#%d %s", e.Event, e.Operation, e.Attempt, e.Outcome)))
		}
	}
	var n int
	if err := h.Pool().QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE what = 'stock'`, h.Table("reservation"))).Scan(&n); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("stock reservations:", n)
	// Output:
	// violations: <nil>
	// faults: [delay (2 timers) at reply parcel-1 stock/action#1 success →orchestrator]
	// time skipped: 1m1s
	// saga: completed
	// command action#1
	// timeout action#1
	// backoff action#1
	// retry action#1
	// command action#2
	// reply action#1 success
	// fenced action#2 success
	// stock reservations: 1
}
