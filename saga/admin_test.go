package saga_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

func TestListByTypeStatusAndAge(t *testing.T) {
	t.Parallel()
	var orders, trips *saga.Definition[order]
	d := setupDriver(t, func(b *testBundle) []saga.Registrable {
		orders = mustDefine(t, orderSpec(b, 1))
		spec := orderSpec(b, 1)
		spec.Type = "trip"
		trips = mustDefine(t, spec)
		return []saga.Registrable{orders, trips}
	})
	ctx := context.Background()
	for i := range 7 {
		start(t, d.testBundle, orders, fmt.Sprintf("o-%d", i), i)
		d.clock.Advance(time.Second)
	}
	for i := range 3 {
		start(t, d.testBundle, trips, fmt.Sprintf("t-%d", i), i)
		d.clock.Advance(time.Second)
	}
	d.reply("o-1", d.last("o-1"), core.OutcomeFailure) // compensated
	cutoff := d.clock.Now()

	var got []string
	p := saga.ListParams{Type: "order", Limit: 3}
	for {
		res, err := d.o.List(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Sagas) > 3 {
			t.Fatalf("page of %d", len(res.Sagas))
		}
		for _, in := range res.Sagas {
			got = append(got, in.ID)
		}
		if res.Next == "" {
			break
		}
		p.Cursor = res.Next
	}
	want := "[o-6 o-5 o-4 o-3 o-2 o-1 o-0]"
	if fmt.Sprint(got) != want {
		t.Fatalf("orders newest first: %v, want %s", got, want)
	}
	res, err := d.o.List(ctx, saga.ListParams{Status: saga.StatusCompensated})
	if err != nil || len(res.Sagas) != 1 || res.Sagas[0].ID != "o-1" {
		t.Fatalf("compensated: %v %v", res, err)
	}
	res, err = d.o.List(ctx, saga.ListParams{Type: "trip", Status: saga.StatusRunning, CreatedBefore: cutoff.Add(-2500 * time.Millisecond)})
	if err != nil || len(res.Sagas) != 1 || res.Sagas[0].ID != "t-0" {
		t.Fatalf("old running trips: %v %v", res, err)
	}
	if _, err := d.o.List(ctx, saga.ListParams{Cursor: "not a cursor"}); !errors.Is(err, saga.ErrInvalidCursor) {
		t.Fatalf("bad cursor: %v", err)
	}
	if _, err := d.o.Get(ctx, "nobody"); !errors.Is(err, saga.ErrNotFound) {
		t.Fatalf("get unknown: %v", err)
	}
}
