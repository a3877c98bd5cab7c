package main

import (
	"context"
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/sqlident"
)

const dedupCallers = 4

// benchDedup measures dedup_ratio: a Watermill handler that writes one row,
// called with unique event ids (a) through inbox.Deduplicator's middleware,
// which runs it in a transaction with the dedup mark, over (b) the same
// handler on its own, opening and committing its own transaction. 4 callers;
// rounds alternate a, b, a, b; the ratio is of the medians.
func (b *bench) benchDedup(ctx context.Context) error {
	pool, schema, done, err := b.workspace(ctx, dedupCallers+2)
	if err != nil {
		return err
	}
	defer done()
	effect := sqlident.Table(schema, "bench_effect")
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effect+` (id uuid PRIMARY KEY, name text NOT NULL, data jsonb NOT NULL)`); err != nil {
		return err
	}
	insert := `INSERT INTO ` + effect + ` (id, name, data) VALUES ($1, $2, $3)`
	apply := func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		_, err := tx.Exec(ctx, insert, msg.UUID, msg.Metadata.Get(core.MetadataPartitionKey), msg.Payload)
		return err
	}

	dedup, err := inbox.NewDeduplicator(pool, inbox.DedupConfig{Schema: schema, Consumer: "bench"})
	if err != nil {
		return err
	}
	withDedup := dedup.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := core.TxFromContext(msg.Context())
		if !ok {
			return nil, errors.New("no transaction in the message context")
		}
		return nil, apply(msg.Context(), tx, msg)
	})
	withoutDedup := func(msg *message.Message) ([]*message.Message, error) {
		return nil, pgx.BeginFunc(msg.Context(), pool, func(tx pgx.Tx) error {
			return apply(msg.Context(), tx, msg)
		})
	}
	call := func(h message.HandlerFunc) func(ctx context.Context, i int) error {
		return func(ctx context.Context, i int) error {
			msg := messageOf(uuid.Must(uuid.NewV7()).String(), i)
			msg.SetContext(ctx)
			_, err := h(msg)
			return err
		}
	}
	a, bb, err := b.alternate(ctx, "dedup", pool, dedupCallers,
		variant{"handler with dedup middleware", call(withDedup)},
		variant{"handler alone", call(withoutDedup)})
	if err != nil {
		return err
	}
	b.results["dedup_ratio"] = round(a/bb, 3)
	b.config["dedup_per_s"] = round(a, 0)
	b.config["dedup_baseline_per_s"] = round(bb, 0)
	b.config["dedup_callers"] = dedupCallers
	return nil
}
