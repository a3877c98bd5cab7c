package sagatest_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
	"github.com/millrace/millrace/saga/sagatest"
)

// order is the test saga's data.
type order struct {
	ID       string `json:"id"`
	Amount   int    `json:"amount"`
	Approved bool   `json:"approved"`
}

type line struct {
	Order  string `json:"order"`
	Amount int    `json:"amount"`
}

// orderDef is a four-step saga: two compensatable remote steps (credit,
// stock), a local pivot (approve) and a retriable remote step (ship).
var orderDef = func() *saga.Definition[order] {
	payload := func(o order) (any, error) { return line{Order: o.ID, Amount: o.Amount}, nil }
	def, err := saga.Define(saga.Spec[order]{
		Type: "order", Version: 1,
		Steps: []saga.Step[order]{
			{Name: "credit", Kind: saga.Compensatable, Timeout: 30 * time.Second,
				Action:       &saga.Command[order]{Topic: "credit", Payload: payload},
				Compensation: &saga.Command[order]{}},
			{Name: "stock", Kind: saga.Compensatable, Timeout: time.Minute,
				Action:       &saga.Command[order]{Topic: "stock", Payload: payload},
				Compensation: &saga.Command[order]{}},
			{Name: "approve", Kind: saga.Pivot,
				Local: func(_ context.Context, _ pgx.Tx, o *order) error { o.Approved = true; return nil }},
			{Name: "ship", Kind: saga.Retriable, Timeout: time.Hour, Retry: saga.RetryPolicy{MaxAttempts: 10},
				Action: &saga.Command[order]{Topic: "ship", Payload: payload}},
		},
	})
	if err != nil {
		panic(err)
	}
	return def
}()

// ledger records every effect: +1 when an action applies, -1 when its
// compensation undoes it.
const ledgerDDL = `CREATE TABLE IF NOT EXISTS %s (seq bigint GENERATED ALWAYS AS IDENTITY, saga_id text NOT NULL, step text NOT NULL, delta int NOT NULL)`

func record(ctx context.Context, tx pgx.Tx, h *sagatest.H, call compensation.Call, delta int) error {
	_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (saga_id, step, delta) VALUES ($1, $2, $3)`, h.Table("ledger")), call.SagaID, call.Step, delta)
	return err
}

// effects is Config.Effects for the ledger: the net effect per step.
func effects(ctx context.Context, h *sagatest.H, sagaID string) (map[string]int, error) {
	out := map[string]int{"credit": 0, "stock": 0, "ship": 0}
	rows, err := h.Pool().Query(ctx, fmt.Sprintf(`SELECT step, sum(delta)::int FROM %s WHERE saga_id = $1 GROUP BY step`, h.Table("ledger")), sagaID)
	if err != nil {
		return nil, err
	}
	var step string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&step, &n}, func() error { out[step] = n; return nil })
	return out, err
}

// participants registers the credit, stock and ship participants, built
// with package compensation: stock refuses orders over 100.
func participants(h *sagatest.H, skip string) error {
	if _, err := h.Pool().Exec(h.Context(), fmt.Sprintf(ledgerDDL, h.Table("ledger"))); err != nil {
		return err
	}
	for _, name := range []string{"credit", "stock", "ship"} {
		if name == skip {
			continue
		}
		p, err := h.NewParticipant(name)
		if err != nil {
			return err
		}
		var undo func(context.Context, pgx.Tx, compensation.Call, line) error
		if name != "ship" {
			undo = func(ctx context.Context, tx pgx.Tx, call compensation.Call, _ line) error {
				return record(ctx, tx, h, call, -1)
			}
		}
		err = compensation.Register(p, name, func(ctx context.Context, tx pgx.Tx, call compensation.Call, l line) (map[string]string, error) {
			if name == "stock" && l.Amount > 100 {
				return nil, compensation.Fail("out of stock")
			}
			return map[string]string{"ok": name}, record(ctx, tx, h, call, +1)
		}, undo)
		if err != nil {
			return err
		}
		if err := h.AddParticipant(p, name); err != nil {
			return err
		}
	}
	return nil
}

// brokenCredit is a credit participant with no barrier: the inbox drops a
// duplicate message, but a new attempt (a new message) applies the action
// again, and a compensation undoes an action that never ran.
func brokenCredit(h *sagatest.H) error {
	dedup, err := inbox.NewDeduplicator(h.Pool(), inbox.DedupConfig{Schema: h.Schema(), Consumer: "broken-credit"})
	if err != nil {
		return err
	}
	h.AddHandler("broken-credit", "credit", dedup.Middleware, func(msg *message.Message) error {
		ctx := msg.Context()
		tx, ok := core.TxFromContext(ctx)
		if !ok {
			return errors.New("no tx")
		}
		md := msg.Metadata
		delta := 1
		if md.Get(core.MetadataSagaOperation) == core.OperationCompensation {
			delta = -1
		}
		call := compensation.Call{SagaID: md.Get(core.MetadataSagaID), Step: md.Get(core.MetadataSagaStep)}
		if err := record(ctx, tx, h, call, delta); err != nil {
			return err
		}
		_, err := h.Writer().WriteTx(ctx, tx, outbox.Event{Topic: md.Get(core.MetadataSagaReplyTopic), PartitionKey: call.SagaID,
			Payload: []byte("{}"), Metadata: map[string]string{
				core.MetadataSagaID: call.SagaID, core.MetadataSagaType: md.Get(core.MetadataSagaType),
				core.MetadataSagaStep: call.Step, core.MetadataSagaAttempt: md.Get(core.MetadataSagaAttempt),
				core.MetadataSagaOperation: md.Get(core.MetadataSagaOperation), core.MetadataSagaOutcome: core.OutcomeSuccess,
			}})
		return err
	})
	return nil
}

// orderScenario starts n orders; every third one is refused by stock.
func orderScenario(n int, broken bool) sagatest.Scenario {
	amounts := make([]int, n)
	for i := range amounts {
		amounts[i] = 10 + i
		if i%3 == 2 {
			amounts[i] = 500
		}
	}
	return orders(broken, amounts...)
}

// orders starts one order per amount, o1, o2, ...: stock refuses amounts
// over 100.
func orders(broken bool, amounts ...int) sagatest.Scenario {
	return func(h *sagatest.H) error {
		skip := ""
		if broken {
			skip = "credit" // the broken credit participant replaces the good one
			if err := brokenCredit(h); err != nil {
				return err
			}
		}
		if err := participants(h, skip); err != nil {
			return err
		}
		if err := h.Register(orderDef); err != nil {
			return err
		}
		for i, amount := range amounts {
			id := "o" + strconv.Itoa(i+1)
			if _, err := saga.Start(h.Context(), h.Orchestrator(), orderDef, id, order{ID: id, Amount: amount}); err != nil {
				return err
			}
		}
		return nil
	}
}
