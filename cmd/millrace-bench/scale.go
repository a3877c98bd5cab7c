package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/internal/retention"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/saga"
)

// Sizes of the scale group: a million sagas with ten history rows each
// and three keys and attributes (quick mode: a tenth).
const (
	scaleSagas        = 1_000_000
	scaleSagasQuick   = 100_000
	scaleHistoryPer   = 10
	scaleInsertChunk  = 50_000
	scalePlanMaxLines = 40
)

// benchScale is the operating-at-scale group (run with -only scale; not in
// the default set, it takes minutes): it fills a schema with a million
// sagas in every status, ten million history rows and three million keys
// and attributes (saga_attr: a customer shared by 20 sagas, an amount, a
// unique payment id), then
//
//   - times the reads an operator makes (saga listings by status and type,
//     a page deep in the keyset, by attribute, one saga's history, the
//     console's overview and sagas pages, a bulk dry run by attribute) and
//     captures each statement's plan with auto_explain (EXPLAIN ANALYZE,
//     sent back as notices);
//   - runs a retention pass (internal/retention, as the service runs it)
//     with the default windows and reports pg_stat_user_tables for the two
//     tables before and after it, and after a VACUUM, with the rate at
//     which it removed sagas.
//
// The sagas are written with SQL (generate_series), not run: the figures
// are about the tables, not the engine.
func (b *bench) benchScale(ctx context.Context) error {
	n := scaleSagas
	if b.opts.quick {
		n = scaleSagasQuick
	}
	pool, schema, done, err := b.workspace(ctx, 8)
	if err != nil {
		return err
	}
	defer done()
	start := time.Now()
	if err := b.fillSagas(ctx, pool, schema, n); err != nil {
		return err
	}
	b.progress("scale: %d sagas, %d history rows written in %s", n, n*scaleHistoryPer, time.Since(start).Round(time.Second))
	b.config["scale_sagas"] = n
	b.config["scale_history_rows"] = n * scaleHistoryPer

	// A saga that was stuck once and then completed, in the middle.
	probe := fmt.Sprintf("saga-%08d", n/2+19)
	// One customer's sagas (20, every status; see fillSagas).
	customer := fmt.Sprintf("c-%06d", (n/2+19)/20)
	plans, err := b.scaleReads(ctx, schema, probe, customer)
	if err != nil {
		return err
	}
	b.config["scale_reads"] = plans

	before, err := tableStats(ctx, pool, schema)
	if err != nil {
		return err
	}
	cl, err := retention.New(pool, retention.Config{Schema: schema})
	if err != nil {
		return err
	}
	cstart := time.Now()
	pass, err := cl.Pass(ctx)
	if err != nil {
		return err
	}
	took := time.Since(cstart)
	removed := pass.Sagas
	b.results["scale_cleaner_removed"] = float64(removed)
	b.results["scale_cleaner_sagas_per_s"] = round(float64(removed)/took.Seconds(), 0)
	b.progress("scale: retention removed %d sagas in %s (%.0f/s)", removed, took.Round(time.Millisecond), float64(removed)/took.Seconds())
	after, err := tableStats(ctx, pool, schema)
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `VACUUM (ANALYZE) `+sqlident.Table(schema, "saga_instance")+`, `+sqlident.Table(schema, "saga_history")); err != nil {
		return err
	}
	vacuumed, err := tableStats(ctx, pool, schema)
	if err != nil {
		return err
	}
	b.config["scale_tables"] = map[string]any{"before_clean": before, "after_clean": after, "after_vacuum": vacuumed}
	for _, s := range []struct {
		when string
		t    map[string]tableStat
	}{{"before clean", before}, {"after clean", after}, {"after vacuum", vacuumed}} {
		for _, name := range []string{"saga_instance", "saga_history"} {
			st := s.t[name]
			b.progress("scale: %-12s %-13s live %9d dead %9d  %7.1f MiB (with indexes)", s.when, name, st.Live, st.Dead, float64(st.TotalBytes)/(1<<20))
		}
	}
	return nil
}

// fillSagas writes n sagas, n*scaleHistoryPer history rows and 3n keys and
// attributes, in chunks. Saga i's attributes: customer c-<i/20> (text:
// 20 sagas each, one of each kind below), amount i mod 1000 (number),
// payment_id pi_<i> (a unique key, held while the saga runs).
// One saga in 20 of each kind:
//
//	12 completed, half of them ended 10 days ago (past the 7-day window)
//	 3 compensated, ended 40 days ago (past 30 days) or 10 days ago
//	 2 running, 2 stuck (never removed)
//	 1 completed once stuck, ended 10 days ago (kept 30 days)
func (b *bench) fillSagas(ctx context.Context, pool *pgxpool.Pool, schema string, n int) error {
	inst, hist := sqlident.Table(schema, "saga_instance"), sqlident.Table(schema, "saga_history")
	insertSagas := `INSERT INTO ` + inst + ` (id, type, def_version, status, phase, step, steps, data, input, created_at, updated_at, ended_at, last_error, next_wakeup_at)
SELECT 'saga-' || lpad(i::text, 8, '0'),
       CASE WHEN i % 3 = 0 THEN 'order' WHEN i % 3 = 1 THEN 'shipment' ELSE 'refund' END, 1,
       st.status, CASE WHEN st.status = 'compensated' THEN 'compensating' ELSE 'forward' END,
       CASE WHEN st.status IN ('running', 'stuck') THEN 'reserve_credit' ELSE '' END,
       '{"reserve_credit": {"status": "done", "attempts": 1}}', '{"amount": 42}', '{"amount": 42}',
       now() - st.age - interval '1 minute', now() - st.age,
       CASE WHEN st.status IN ('running', 'stuck') THEN NULL ELSE now() - st.age END,
       CASE WHEN st.status = 'stuck' THEN 'reserve_credit: refund hold on account ' || i ELSE '' END,
       CASE WHEN st.status = 'running' THEN now() + interval '1 hour' END
  FROM generate_series($1::int, $2::int - 1) i,
       LATERAL (SELECT CASE
           WHEN i % 20 < 12 THEN 'completed' WHEN i % 20 < 15 THEN 'compensated'
           WHEN i % 20 < 17 THEN 'running' WHEN i % 20 < 19 THEN 'stuck' ELSE 'completed' END AS status,
         CASE
           WHEN i % 20 < 12 THEN CASE WHEN i % 2 = 0 THEN interval '10 days' ELSE interval '1 day' END
           WHEN i % 20 < 15 THEN CASE WHEN i % 2 = 0 THEN interval '40 days' ELSE interval '10 days' END
           WHEN i % 20 < 19 THEN interval '2 hours' ELSE interval '10 days' END AS age) st`
	insertHistory := `INSERT INTO ` + hist + ` (saga_id, at, event, step, status)
SELECT 'saga-' || lpad(i::text, 8, '0'), now() - interval '10 days' + j * interval '1 second',
       CASE WHEN j = 0 THEN 'started'
            WHEN j = 5 AND i % 20 = 19 THEN 'stuck'
            WHEN j = $3 - 1 AND i % 20 < 12 THEN 'completed'
            WHEN j = $3 - 1 AND i % 20 < 15 THEN 'compensated'
            WHEN j % 2 = 1 THEN 'command' ELSE 'reply' END,
       'reserve_credit', 'running'
  FROM generate_series($1::int, $2::int - 1) i, generate_series(0, $3 - 1) j`
	attr := sqlident.Table(schema, "saga_attr")
	insertAttrs := `INSERT INTO ` + attr + ` (saga_id, name, type, kind, value, num, live, created_at)
SELECT s.id, a.name, s.type, a.kind, a.value, a.num, s.ended_at IS NULL, s.created_at
  FROM generate_series($1::int, $2::int - 1) i
  JOIN ` + inst + ` s ON s.id = 'saga-' || lpad(i::text, 8, '0'),
       LATERAL (VALUES ('customer', 'text', 'c-' || lpad((i / 20)::text, 6, '0'), NULL::float8),
                       ('amount', 'number', NULL, (i % 1000)::float8),
                       ('payment_id', 'unique_key', 'pi_' || i, NULL)) AS a(name, kind, value, num)`
	for from := 0; from < n; from += scaleInsertChunk {
		to := min(from+scaleInsertChunk, n)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, insertSagas, from, to); err != nil {
				return fmt.Errorf("insert sagas: %w", err)
			}
			if _, err := tx.Exec(ctx, insertHistory, from, to, scaleHistoryPer); err != nil {
				return fmt.Errorf("insert history: %w", err)
			}
			if _, err := tx.Exec(ctx, insertAttrs, from, to); err != nil {
				return fmt.Errorf("insert keys and attributes: %w", err)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if to%(scaleInsertChunk*4) == 0 || to == n {
			b.progress("scale: %d/%d sagas written", to, n)
		}
	}
	_, err := pool.Exec(ctx, `VACUUM (ANALYZE) `+inst+`, `+hist+`, `+attr)
	return err
}

// scaleRead is one operator read: how long it took and its statements'
// plans.
type scaleRead struct {
	Name  string   `json:"name"`
	Ms    float64  `json:"ms"`
	Plans []string `json:"plans"`
}

// scaleReads times the operator's reads on a pool whose connections load
// auto_explain and send every statement's EXPLAIN ANALYZE back as a
// notice, and returns them with their plans.
func (b *bench) scaleReads(ctx context.Context, schema, probe, customer string) ([]scaleRead, error) {
	cfg, err := pgxpool.ParseConfig(b.dbURL)
	if err != nil {
		return nil, err
	}
	var (
		mu      sync.Mutex
		current []string
	)
	cfg.MaxConns = 1 // one connection: the notices of a read are its own
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if !strings.Contains(n.Message, "plan:") {
			return
		}
		mu.Lock()
		current = append(current, n.Message)
		mu.Unlock()
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `LOAD 'auto_explain';
SET auto_explain.log_min_duration = 0; SET auto_explain.log_analyze = on;
SET auto_explain.log_buffers = on; SET auto_explain.log_timing = off;
SET auto_explain.log_level = notice; SET client_min_messages = notice`)
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	orch, err := saga.New(pool, saga.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	// Every page as a viewer, the least role (payloads redacted).
	viewer := func(*http.Request) (console.Identity, error) {
		return console.Identity{Name: "bench", Roles: []string{"viewer"}}, nil
	}
	con, err := console.New(pool, console.Config{Schema: schema, Sagas: orch, Authenticate: viewer})
	if err != nil {
		return nil, err
	}
	page := func(path string) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			rec := httptest.NewRecorder()
			con.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, path, nil))
			if rec.Code != http.StatusOK {
				return fmt.Errorf("GET %s: %d %s", path, rec.Code, strings.TrimSpace(rec.Body.String()))
			}
			return nil
		}
	}
	list := func(p saga.ListParams, pages int) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			for range pages {
				res, err := orch.List(ctx, p)
				if err != nil {
					return err
				}
				if res.Next == "" {
					return nil
				}
				p.Cursor = res.Next
			}
			return nil
		}
	}
	reads := []struct {
		name string
		fn   func(ctx context.Context) error
	}{
		{"list stuck sagas, first page of 100", list(saga.ListParams{Status: saga.StatusStuck}, 1)},
		{"list stuck sagas of one type, first page", list(saga.ListParams{Type: "order", Status: saga.StatusStuck}, 1)},
		{"list every saga, 50th page of 100 (keyset)", list(saga.ListParams{}, 50)},
		{"list sagas older than 5 days, first page", list(saga.ListParams{CreatedBefore: time.Now().Add(-5 * 24 * time.Hour)}, 1)},
		{"one saga's history", func(ctx context.Context) error {
			h, err := orch.History(ctx, probe)
			if err == nil && len(h) != scaleHistoryPer {
				err = fmt.Errorf("%d history rows, want %d", len(h), scaleHistoryPer)
			}
			return err
		}},
		{"list sagas by attribute customer=<one of n/20>, first page", list(saga.ListParams{Attrs: []string{"customer=" + customer}}, 1)},
		{"list stuck sagas of one customer", list(saga.ListParams{Status: saga.StatusStuck, Attrs: []string{"customer=" + customer}}, 1)},
		{"list sagas by unique key payment_id, one saga", list(saga.ListParams{Attrs: []string{"payment_id=pi_" + strings.TrimLeft(strings.TrimPrefix(probe, "saga-"), "0")}}, 1)},
		{"list sagas by number range amount>=999 (0.1%), first page", list(saga.ListParams{Attrs: []string{"amount>=999"}}, 1)},
		{"bulk dry run: stuck sagas of one customer", func(ctx context.Context) error {
			_, err := orch.DryRun(ctx, saga.Query{Status: saga.StatusStuck, Attrs: []string{"customer=" + customer}}, 20)
			return err
		}},
		{"console overview (counts and the last hour's charts)", page("/")},
		{"console sagas page, stuck", page("/sagas?status=stuck")},
		{"console sagas page, one customer", page("/sagas?attr=customer%3D" + customer)},
		{"console saga page", page("/saga?id=" + probe)},
	}
	var out []scaleRead
	for _, r := range reads {
		_ = r.fn(ctx) // warm the connection and the cache once
		mu.Lock()
		current = nil
		mu.Unlock()
		start := time.Now()
		if err := r.fn(ctx); err != nil {
			return nil, fmt.Errorf("%s: %w", r.name, err)
		}
		ms := float64(time.Since(start).Microseconds()) / 1000
		mu.Lock()
		plans := append([]string(nil), current...)
		mu.Unlock()
		for i, p := range plans {
			plans[i] = trimPlan(p)
		}
		out = append(out, scaleRead{Name: r.name, Ms: round(ms, 2), Plans: plans})
		b.progress("scale: %-55s %8.2f ms, %d statements", r.name, ms, len(plans))
	}
	return out, nil
}

// trimPlan keeps a plan's first lines: the query text and its top nodes.
func trimPlan(p string) string {
	lines := strings.Split(p, "\n")
	if len(lines) > scalePlanMaxLines {
		lines = append(lines[:scalePlanMaxLines], "...")
	}
	return strings.Join(lines, "\n")
}

// tableStat is a table's line in pg_stat_user_tables, with its size.
type tableStat struct {
	Live       int64 `json:"n_live_tup"`
	Dead       int64 `json:"n_dead_tup"`
	Deleted    int64 `json:"n_tup_del"`
	TotalBytes int64 `json:"total_bytes"`
}

// tableStats reads the saga tables' statistics. A backend reports its
// counts at most once a second, and an idle one only after seconds: the
// pool's connections are closed first (a backend reports when it exits),
// and the figures read until two reads a second apart agree.
func tableStats(ctx context.Context, pool *pgxpool.Pool, schema string) (map[string]tableStat, error) {
	pool.Reset()
	var last map[string]tableStat
	for range 30 {
		s, err := readTableStats(ctx, pool, schema)
		if err != nil {
			return nil, err
		}
		if fmt.Sprint(s) == fmt.Sprint(last) {
			return s, nil
		}
		last = s
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return last, nil
}

func readTableStats(ctx context.Context, pool *pgxpool.Pool, schema string) (map[string]tableStat, error) {
	rows, err := pool.Query(ctx, `SELECT relname, n_live_tup, n_dead_tup, n_tup_del, pg_total_relation_size(relid)
  FROM pg_stat_user_tables WHERE schemaname = $1 AND relname IN ('saga_instance', 'saga_history')`, schema)
	if err != nil {
		return nil, err
	}
	out := map[string]tableStat{}
	for rows.Next() {
		var name string
		var s tableStat
		if err := rows.Scan(&name, &s.Live, &s.Dead, &s.Deleted, &s.TotalBytes); err != nil {
			return nil, err
		}
		out[name] = s
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) != 2 {
		names := make([]string, 0, len(out))
		for k := range out {
			names = append(names, k)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("pg_stat_user_tables: found %v in %s", names, schema)
	}
	return out, nil
}
