package saga_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
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
	d.reply("mig-stock", d.last("mig-stock"), core.OutcomeSuccess)
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
	d.reply("mig-credit", d.last("mig-credit"), core.OutcomeSuccess)
	if c := d.last("mig-credit"); c.Step != "inventory" {
		t.Fatalf("after credit: %+v", c)
	}
	d.reply("mig-credit", d.last("mig-credit"), core.OutcomeSuccess)
	if c := d.last("mig-credit"); c.Step != "notify" {
		t.Fatalf("after inventory: %+v", c)
	}
	d.reply("mig-credit", d.last("mig-credit"), core.OutcomeSuccess)
	if in := d.get("mig-credit"); in.Status != saga.StatusCompleted {
		t.Fatalf("status %s", in.Status)
	}
	// mig-stock stays on v1 and finishes there.
	d.reply("mig-stock", d.last("mig-stock"), core.OutcomeSuccess)
	if in := d.get("mig-stock"); in.Status != saga.StatusCompleted || in.Version != 1 {
		t.Fatalf("mig-stock: %s v%d", in.Status, in.Version)
	}
	// Without the rename it would move: nothing live is left to move.
	m.Steps = nil
	if n, err := saga.Migrate(ctx, d.o, m); n != 0 || err != nil {
		t.Fatalf("second run: %d, %v", n, err)
	}
	m.Operator = ""
	if _, err := saga.Migrate(ctx, d.o, m); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("no operator: %v", err)
	}
}

// plainSpec is groupSpec with no parallel group: reserve, credit, stock,
// ship one after the other.
func plainSpec(version int) saga.Spec[order] {
	spec := groupSpec()
	spec.Version = version
	for i := range spec.Steps {
		spec.Steps[i].Group = ""
	}
	return spec
}

func migrateDriver(t *testing.T, from, to saga.Spec[order]) (*driver, *saga.Definition[order], *saga.Definition[order]) {
	t.Helper()
	var v1, v2 *saga.Definition[order]
	d := setupDriver(t, func(b *testBundle) []saga.Registrable {
		v1, v2 = mustDefine(t, from), mustDefine(t, to)
		return []saga.Registrable{v1, v2}
	})
	return d, v1, v2
}

// An instance whose current step would join a parallel group in the new
// version is refused (the other members would never start, and the next
// success would compensate the saga); one inside a group moves when the
// group maps onto one group of the new version.
func TestMigrateParallelGroups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("current step joins a group", func(t *testing.T) {
		t.Parallel()
		to := groupSpec()
		to.Version = 2
		d, v1, v2 := migrateDriver(t, plainSpec(1), to)
		id := "mig-into-group"
		start(t, d.testBundle, v1, id, 1)
		d.reply(id, d.last(id), core.OutcomeSuccess) // reserve; credit sent
		n, err := saga.Migrate(ctx, d.o, saga.Migration[order, order]{From: v1, To: v2, Operator: "alice", Reason: "groups"})
		if n != 0 || !errors.Is(err, saga.ErrCannotMigrate) || !strings.Contains(err.Error(), `member of parallel group "pay" in v2, whose other members would never start`) {
			t.Fatalf("moved %d: %v", n, err)
		}
		if in := d.get(id); in.Version != 1 || in.Step != "credit" {
			t.Fatalf("the refused instance changed: v%d at %s", in.Version, in.Step)
		}
	})
	t.Run("inside a group", func(t *testing.T) {
		t.Parallel()
		to := groupSpec()
		to.Version = 2
		to.Steps = append(to.Steps, saga.Step[order]{Name: "notify", Kind: saga.Compensatable, Action: &saga.Command[order]{Topic: "notify"}, Timeout: time.Second})
		d, v1, v2 := migrateDriver(t, groupSpec(), to)
		id := "mig-in-group"
		start(t, d.testBundle, v1, id, 1)
		d.reply(id, d.last(id), core.OutcomeSuccess) // reserve; credit and stock sent
		d.reply(id, d.find(id, "stock", "action"), core.OutcomeSuccess)
		if in := d.get(id); in.Step != "pay" {
			t.Fatalf("step %s", in.Step)
		}
		n, err := saga.Migrate(ctx, d.o, saga.Migration[order, order]{From: v1, To: v2, Operator: "alice", Reason: "notify"})
		if n != 1 || err != nil {
			t.Fatalf("moved %d: %v", n, err)
		}
		if in := d.get(id); in.Version != 2 || in.Step != "pay" {
			t.Fatalf("after the migration: v%d at %s", in.Version, in.Step)
		}
		d.reply(id, d.find(id, "credit", "action"), core.OutcomeSuccess)
		d.reply(id, d.find(id, "ship", "action"), core.OutcomeSuccess)
		d.reply(id, d.find(id, "notify", "action"), core.OutcomeSuccess)
		if in := d.get(id); in.Status != saga.StatusCompleted {
			t.Fatalf("status %s (%q)", in.Status, in.LastError)
		}
	})
	t.Run("group gains a member", func(t *testing.T) {
		t.Parallel()
		to := groupSpec()
		to.Version = 2
		extra := to.Steps[2]
		extra.Name = "points"
		to.Steps = append(to.Steps[:3], append([]saga.Step[order]{extra}, to.Steps[3:]...)...)
		d, v1, v2 := migrateDriver(t, groupSpec(), to)
		id := "mig-group-grows"
		start(t, d.testBundle, v1, id, 1)
		d.reply(id, d.last(id), core.OutcomeSuccess)
		n, err := saga.Migrate(ctx, d.o, saga.Migration[order, order]{From: v1, To: v2, Operator: "alice", Reason: "points"})
		if n != 0 || !errors.Is(err, saga.ErrCannotMigrate) || !strings.Contains(err.Error(), "has other members too") {
			t.Fatalf("moved %d: %v", n, err)
		}
	})
}

// A step inserted before the current one would never run: refused. A
// rename map sending two old steps to one new name is refused up front.
func TestMigrateRefusesWhatWouldBeLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	to := plainSpec(2)
	check := saga.Step[order]{Name: "check", Kind: saga.Compensatable, Action: &saga.Command[order]{Topic: "check"}, Timeout: time.Second}
	to.Steps = append(to.Steps[:1], append([]saga.Step[order]{check}, to.Steps[1:]...)...) // reserve, check, credit, ...
	d, v1, v2 := migrateDriver(t, plainSpec(1), to)
	renamed := plainSpec(2)
	renamed.Steps[3].Name = "dispatch"
	r2 := mustDefine(t, renamed)
	for _, steps := range []map[string]string{
		{"stock": "dispatch", "ship": "dispatch"},
		{"ship": "stock"}, // and stock keeps its name
	} {
		_, err := saga.Migrate(ctx, d.o, saga.Migration[order, order]{From: v1, To: r2, Steps: steps, Operator: "alice", Reason: "rename"})
		if !errors.Is(err, core.ErrConfig) || !strings.Contains(err.Error(), "would both become step") {
			t.Fatalf("rename %v: %v", steps, err)
		}
	}
	id := "mig-inserted"
	start(t, d.testBundle, v1, id, 1)
	d.reply(id, d.last(id), core.OutcomeSuccess) // reserve; credit sent
	n, err := saga.Migrate(ctx, d.o, saga.Migration[order, order]{From: v1, To: v2, Operator: "alice", Reason: "check"})
	if n != 0 || !errors.Is(err, saga.ErrCannotMigrate) || !strings.Contains(err.Error(), `step "check" of v2 comes before the current step "credit" and has not run`) {
		t.Fatalf("moved %d: %v", n, err)
	}
	// An instance still at the first step moves: check is ahead of it.
	start(t, d.testBundle, v1, "mig-first", 1)
	if n, err := saga.Migrate(ctx, d.o, saga.Migration[order, order]{From: v1, To: v2, Operator: "alice", Reason: "check"}); n != 1 || !errors.Is(err, saga.ErrCannotMigrate) {
		t.Fatalf("moved %d: %v", n, err)
	}
}
