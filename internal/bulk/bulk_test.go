package bulk

import (
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/millrace/millrace/core"
)

type row struct {
	id  int64
	err string
	at  time.Time
}

// A walk over several pages: every kept row once, in id order, pages
// with none kept skipped; the dry run's count and first page, and Apply's
// sum, across pages.
func TestWalkPages(t *testing.T) {
	now := time.Now()
	var rows []row
	for i := range 3*PageSize + 7 {
		r := row{id: int64(2*i + 1), err: "timeout", at: now}
		if i%3 == 0 || (i >= PageSize && i < 2*PageSize) { // the whole second page is left out
			r.err = "malformed"
		}
		rows = append(rows, r)
	}
	lists := 0
	list := func(after int64) ([]row, error) {
		lists++
		i, _ := slices.BinarySearchFunc(rows, after+1, func(r row, id int64) int { return int(r.id - id) })
		return rows[i:min(i+PageSize, len(rows))], nil
	}
	match, err := Match("time%", now.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	walk := func(fn func([]row) error) error {
		return Walk(list, func(r row) int64 { return r.id }, func(r row) bool { return match(r.err, r.at) }, fn)
	}
	var want []int64
	for _, r := range rows {
		if r.err == "timeout" {
			want = append(want, r.id)
		}
	}
	var got []int64
	calls := 0
	if err := walk(func(page []row) error {
		calls++
		for _, r := range page {
			got = append(got, r.id)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) || calls != 3 || lists != 5 {
		t.Fatalf("walk: %d rows in %d calls over %d lists; want %d in 3 over 5", len(got), calls, lists, len(want))
	}
	n, first, err := DryRun(walk, 0)
	if err != nil || n != len(want) || len(first) != 20 || first[0].id != want[0] || first[19].id != want[19] {
		t.Fatalf("dry run: %d, %d first, %v", n, len(first), err)
	}
	acted := 0
	total, err := Apply(walk, func(r row) string { return strconv.FormatInt(r.id, 10) }, func(keys ...string) (int, error) {
		acted += len(keys)
		return len(keys) - 1, nil // one changed meanwhile in each page
	})
	if err != nil || acted != len(want) || total != len(want)-3 {
		t.Fatalf("apply: %d of %d acted on, %v", total, acted, err)
	}
	boom := errors.New("boom")
	if _, err := Apply(walk, func(r row) string { return "" }, func(...string) (int, error) { return 1, boom }); !errors.Is(err, boom) {
		t.Fatalf("apply's error: %v", err)
	}
	old, _ := Match("", now.Add(-time.Second))
	if n, _, _ := DryRun(func(fn func([]row) error) error {
		return Walk(list, func(r row) int64 { return r.id }, func(r row) bool { return old(r.err, r.at) }, fn)
	}, 5); n != 0 {
		t.Fatalf("nothing died before a second ago, yet %d", n)
	}
	// A pattern PostgreSQL's LIKE refuses is refused, not matched some
	// other way: the dry run and the action fail alike.
	for _, p := range []string{`timeout\`, "time\xff%"} {
		if _, err := Match(p, time.Time{}); !errors.Is(err, core.ErrInvalidListParams) {
			t.Errorf("Match(%q): %v", p, err)
		}
	}
}

// List fills in the default limit, keeps params that are set, and refuses
// negative ones with core.ErrInvalidListParams.
func TestListAppliesDefaultsAndRefusesNegatives(t *testing.T) {
	t.Parallel()
	if p, err := List(core.ListParams{}); err != nil || p.Limit != core.DefaultListLimit {
		t.Fatalf("zero ListParams: %+v, %v", p, err)
	}
	set := core.ListParams{Limit: 3, AfterID: 7, Topic: "t", PartitionKey: "k"}
	if p, err := List(set); err != nil || p != set {
		t.Fatalf("set ListParams changed: %+v, %v", p, err)
	}
	for _, p := range []core.ListParams{{Limit: -1}, {AfterID: -1}} {
		if _, err := List(p); !errors.Is(err, core.ErrInvalidListParams) {
			t.Fatalf("%+v: %v, want ErrInvalidListParams", p, err)
		}
	}
}
