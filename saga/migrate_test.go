package saga_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace"
	"github.com/millrace/millrace/saga"
)

type orderV2 struct {
	order
	Currency string `json:"currency"`
}

func TestMigrateLiveInstances(t *testing.T) {
	t.Parallel()
	var v1 *saga.Definition[order]
	d := setupDriver(t, func(b *testBundle) []saga.Registrable {
		v1 = mustDefine(t, orderSpec(b, 1))
		return []saga.Registrable{v1}
	})
	ctx := context.Background()
	start(t, d.testBundle, v1, "mig-stock", 3) // will wait at stock
	d.reply("mig-stock", d.last("mig-stock"), millrace.OutcomeSuccess)
	start(t, d.testBundle, v1, "mig-credit", 4) // waits at credit

	// v2 renames the unstarted "stock" to "inventory" and adds "notify".
	spec := orderSpec(d.testBundle, 1)
	steps := []saga.Step[orderV2]{}
	for _, s := range spec.Steps {
		s2 := saga.Step[orderV2]{Name: s.Name, Kind: s.Kind, Timeout: s.Timeout}
		if s.Action != nil {
			s2.Action = &saga.Command[orderV2]{Topic: s.Action.Topic}
			s2.Compensation = &saga.Command[orderV2]{}
		} else {
			s2.Local = func(ctx context.Context, tx pgx.Tx, o *orderV2) error { return s.Local(ctx, tx, &o.order) }
			s2.LocalCompensation = func(ctx context.Context, tx pgx.Tx, o *orderV2) error { return s.LocalCompensation(ctx, tx, &o.order) }
		}
		if s.Name == "stock" {
			s2.Name = "inventory"
		}
		steps = append(steps, s2)
	}
	steps = append(steps, saga.Step[orderV2]{Name: "notify", Kind: saga.Compensatable, Action: &saga.Command[orderV2]{Topic: "notify"}})
	v2 := mustDefine(t, saga.Spec[orderV2]{Type: "order", Version: 2, Steps: steps})
	if err := d.o.Register(v2); err != nil {
		t.Fatal(err)
	}
	m := saga.Migration[order, orderV2]{From: v1, To: v2, Steps: map[string]string{"stock": "inventory"},
		Data:     func(o order) (orderV2, error) { return orderV2{order: o, Currency: "EUR"}, nil },
		Operator: "alice", Reason: "v2 rollout"}
	n, err := saga.Migrate(ctx, d.o, m)
	// mig-stock has sent its stock command: the rename is refused for it.
	if n != 1 || !errors.Is(err, saga.ErrCannotMigrate) || !strings.Contains(err.Error(), "mig-stock") || !strings.Contains(err.Error(), "cannot be renamed") {
		t.Fatalf("moved %d: %v", n, err)
	}
	in := d.get("mig-credit")
	if in.Version != 2 || !strings.Contains(string(in.Data), `"currency": "EUR"`) {
		t.Fatalf("mig-credit: v%d %s", in.Version, in.Data)
	}
	// It goes on on v2: credit's reply (sent before the migration) applies,
	// then the renamed and the new step run.
	d.reply("mig-credit", d.last("mig-credit"), millrace.OutcomeSuccess)
	if c := d.last("mig-credit"); c.Step != "inventory" {
		t.Fatalf("after credit: %+v", c)
	}
	d.reply("mig-credit", d.last("mig-credit"), millrace.OutcomeSuccess)
	if c := d.last("mig-credit"); c.Step != "notify" {
		t.Fatalf("after inventory: %+v", c)
	}
	d.reply("mig-credit", d.last("mig-credit"), millrace.OutcomeSuccess)
	if in := d.get("mig-credit"); in.Status != saga.StatusCompleted {
		t.Fatalf("status %s", in.Status)
	}
	// mig-stock stays on v1 and finishes there.
	d.reply("mig-stock", d.last("mig-stock"), millrace.OutcomeSuccess)
	if in := d.get("mig-stock"); in.Status != saga.StatusCompleted || in.Version != 1 {
		t.Fatalf("mig-stock: %s v%d", in.Status, in.Version)
	}
	// Without the rename it would move: nothing live is left to move.
	m.Steps = nil
	if n, err := saga.Migrate(ctx, d.o, m); n != 0 || err != nil {
		t.Fatalf("second run: %d, %v", n, err)
	}
	m.Operator = ""
	if _, err := saga.Migrate(ctx, d.o, m); !errors.Is(err, millrace.ErrConfig) {
		t.Fatalf("no operator: %v", err)
	}
}
