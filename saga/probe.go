package saga

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/pgprobe"
)

// tablesError returns err with what to do about it when it says that the
// saga tables are missing from the schema (or a privilege on them), else
// err itself.
func (o *Orchestrator) tablesError(err error) error {
	switch {
	case pgprobe.NoPrivilege(err):
		return fmt.Errorf("saga: no privilege on the saga tables in schema %q: privileges granted? %w", o.schema, err)
	case pgprobe.Unusable(err):
		return fmt.Errorf("saga: saga tables missing in schema %q: migrations applied? %w", o.schema, err)
	}
	return err
}

// probe runs the timer pass's statements on no rows, in a transaction it
// rolls back (internal/pgprobe, as the outbox relay does): it returns an
// error only when a table or a privilege is missing; other failures (the
// database is not up yet) are logged and retried until ctx ends.
func (o *Orchestrator) probe(ctx context.Context) error {
	now := o.clock.Now()
	err := pgprobe.Probe(ctx, o.pool, 30*o.poll, func(err error, wait time.Duration) {
		o.logger.Error("saga: cannot reach the database at start; retrying", err, map[string]any{"retry_in": wait.String()})
	}, func(tx pgx.Tx) error {
		for _, q := range []struct {
			sql  string
			args []any
		}{
			{o.sql.claim, []any{now, 0, []string{}, []int32{}}},
			{o.sql.claimRequests, []any{[]string{}, []int32{}, 0}},
			{o.sql.park, []any{"", "", now}},
			{o.sql.failuresInARow, []any{"", eventTimerFailed}},
			{o.sql.history, historyArgs(nil)},
			{o.sql.events.claimNew, []any{[]string{}, []int32{}, 0}},
			{o.sql.attr.holders, []any{"", "", ""}}, // migration 014
		} {
			rows, err := tx.Query(ctx, q.sql, q.args...)
			if err != nil {
				return err
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
		}
		// The requests' audit trail, on no entry.
		if err := o.trail.Probe(ctx, tx); err != nil {
			return err
		}
		// The batched replies' dedup marks (rolled back with the probe).
		_, err := o.dedup.MarkTx(ctx, tx, message.NewMessage(uuid.NewString(), nil))
		return err
	})
	if err != nil {
		return o.tablesError(err)
	}
	return nil
}
