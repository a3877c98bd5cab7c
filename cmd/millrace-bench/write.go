package main

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/outbox"
)

const writers = 8

// benchWrite measures write_ratio: 8 writers running one-row business
// transactions that also write (a) one outbox event with Writer.WriteTx, or
// (b) one more plain INSERT into a table with similar columns. Rounds
// alternate a, b, a, b; the ratio is of the medians.
func (b *bench) benchWrite(ctx context.Context) error {
	tpsA, tpsB, err := b.writeRatio(ctx, "write", false)
	if err != nil {
		return err
	}
	b.results["write_tps_outbox"] = round(tpsA, 0)
	b.results["write_tps_plain"] = round(tpsB, 0)
	b.results["write_ratio"] = round(tpsA/tpsB, 3)
	b.config["write_writers"] = writers
	return nil
}

// writeRatio runs the write_ratio comparison and returns the median rates
// of (a) and (b). With cdc, (a)'s Writer is a CDC-mode Writer
// (WriterConfig.CDC) and the schema has its publication and slot (no relay
// runs, as in the polling comparison); they are dropped at the end.
func (b *bench) writeRatio(ctx context.Context, group string, cdc bool) (tpsA, tpsB float64, err error) {
	pool, schema, done, err := b.workspace(ctx, writers+2)
	if err != nil {
		return 0, 0, err
	}
	defer done()
	business, plain := sqlident.Table(schema, "bench_business"), sqlident.Table(schema, "bench_plain")
	for _, t := range []string{business, plain} {
		if _, err := pool.Exec(ctx, `CREATE TABLE `+t+` (id uuid PRIMARY KEY, name text NOT NULL, data jsonb NOT NULL)`); err != nil {
			return 0, 0, err
		}
	}
	// The Writer as a service would use it: wake-up hints coalesced (the
	// default), or in CDC mode with the slot in place.
	wcfg := outbox.WriterConfig{Schema: schema}
	if cdc {
		dropCDC, err := b.createCDC(ctx, pool, schema)
		if err != nil {
			return 0, 0, err
		}
		defer dropCDC()
		wcfg.CDC = true
	}
	w, err := outbox.NewWriter(pool, wcfg)
	if err != nil {
		return 0, 0, err
	}
	insertBusiness := `INSERT INTO ` + business + ` (id, name, data) VALUES ($1, $2, $3)`
	insertPlain := `INSERT INTO ` + plain + ` (id, name, data) VALUES ($1, $2, $3)`
	topic := newTopic("write")

	withEvent := func(ctx context.Context, i int) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, insertBusiness, uuid.Must(uuid.NewV7()), keyOf(i), payloadOf(i)); err != nil {
				return err
			}
			_, err := w.WriteTx(ctx, tx, eventOf(topic, i))
			return err
		})
	}
	withInsert := func(ctx context.Context, i int) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, insertBusiness, uuid.Must(uuid.NewV7()), keyOf(i), payloadOf(i)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, insertPlain, uuid.Must(uuid.NewV7()), keyOf(i), payloadOf(i))
			return err
		})
	}
	name := "business tx + outbox event"
	if cdc {
		name = "business tx + outbox event (CDC)"
	}
	return b.alternate(ctx, group, pool, writers,
		variant{name, withEvent},
		variant{"business tx + plain insert", withInsert})
}

// variant is one side of an a/b comparison: op does one unit of work.
type variant struct {
	name string
	op   func(ctx context.Context, i int) error
}

// alternate runs a and b for the phase duration each, twice, in the order
// a, b, a, b, with workers goroutines, and returns the median rate of each
// in operations per second.
func (b *bench) alternate(ctx context.Context, group string, pool *pgxpool.Pool, workers int, a, v variant) (float64, float64, error) {
	var rates [2][]float64
	for round := range 2 {
		for k, vr := range []variant{a, v} {
			// Start each run from a checkpoint, so that one run does not pay
			// for the dirty pages of the previous one.
			if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
				b.progress("%s: CHECKPOINT: %v (continuing)", group, err)
			}
			ops, elapsed, err := forEach(ctx, workers, b.opts.duration, func(ctx context.Context, worker int) (int, error) {
				return 1, vr.op(ctx, rand.IntN(1<<20))
			})
			if err != nil {
				return 0, 0, fmt.Errorf("%s: %w", vr.name, err)
			}
			rate := float64(ops) / elapsed.Seconds()
			rates[k] = append(rates[k], rate)
			b.progress("%s: round %d, %s: %.0f/s", group, round+1, vr.name, rate)
		}
	}
	return median(rates[0]), median(rates[1]), nil
}
