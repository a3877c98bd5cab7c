package outbox

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/internal/sqlident"
)

// Errors of change data capture.
var (
	// ErrWALLevel is returned by CDCRelay.Run and Admin.CreateCDC on a
	// server whose wal_level is not logical: it writes no logical decoding
	// information, and there is nothing to stream. Set wal_level = logical
	// (a server restart) or use the polling Relay.
	ErrWALLevel = errors.New("outbox: CDC needs wal_level = logical")
	// ErrNoSlot is returned by CDCRelay.Run when the publication or the
	// replication slot it streams from does not exist: create them with
	// Admin.CreateCDC (or `millrace outbox cdc create`).
	ErrNoSlot = errors.New("outbox: CDC publication or replication slot missing (create them with Admin.CreateCDC or `millrace outbox cdc create`)")
)

// slotName is what PostgreSQL accepts as a replication slot name, with room
// for the recovery suffix.
var slotName = regexp.MustCompile(`^[a-z0-9_]{1,61}$`)

// DefaultSlot returns the name of the replication slot and of the
// publication of a schema's CDC relays: "millrace_" and the schema, or
// "millrace_" and a hash of it when that would be too long for a slot name.
func DefaultSlot(schema string) string {
	if schema == "" {
		schema = sqlident.DefaultSchema
	}
	if name := "millrace_" + schema; len(name) <= 61 {
		return name
	}
	return "millrace_" + sqlident.Hash(schema)
}

// slotPair returns the two names a group's slot goes by: the slot lives
// under one of them; when it is invalidated, its replacement is created
// under the other before the lost one is dropped, so a recovery cut short
// by a crash is found and finished at the next start.
func slotPair(slot string) [2]string { return [2]string{slot, slot + "_b"} }

// checkWALLevel returns an error wrapping ErrWALLevel unless the server
// runs with wal_level = logical.
func checkWALLevel(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) error {
	var level string
	if err := db.QueryRow(ctx, `SELECT current_setting('wal_level')`).Scan(&level); err != nil {
		return fmt.Errorf("outbox: read wal_level: %w", err)
	}
	if level != "logical" {
		return fmt.Errorf("%w: the server has wal_level = %s; set wal_level = logical in postgresql.conf and restart it, or run the polling Relay", ErrWALLevel, level)
	}
	return nil
}

// slotState is one replication slot as pg_replication_slots shows it.
type slotState struct {
	name      string
	active    bool
	walStatus string // reserved, extended, unreserved or lost
	lagBytes  int64
}

func (s slotState) lost() bool { return s.walStatus == "lost" }

// slots returns the slots of the pair that exist.
func slots(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, slot string) ([]slotState, error) {
	pair := slotPair(slot)
	rows, err := db.Query(ctx, `SELECT slot_name::text, active, coalesce(wal_status, ''),
       coalesce(pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END, confirmed_flush_lsn), 0)::int8
  FROM pg_replication_slots WHERE slot_name = ANY($1) ORDER BY slot_name`, pair[:])
	if err != nil {
		return nil, fmt.Errorf("outbox: read replication slot %q: %w", slot, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (slotState, error) {
		var s slotState
		err := r.Scan(&s.name, &s.active, &s.walStatus, &s.lagBytes)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: read replication slot %q: %w", slot, err)
	}
	return out, nil
}

// createSlot creates a pgoutput slot, treating one that exists as created.
func createSlot(ctx context.Context, pool *pgxpool.Pool, name string) error {
	_, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, name)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" { // duplicate_object
		return nil
	}
	if err != nil {
		return fmt.Errorf("outbox: create replication slot %q: %w", name, err)
	}
	return nil
}

// dropSlot drops a slot if it exists. A slot in use (by a CDC relay of
// the group) cannot be dropped: stop the relays first.
func dropSlot(ctx context.Context, pool *pgxpool.Pool, name string) error {
	_, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, name)
	if err != nil {
		return fmt.Errorf("outbox: drop replication slot %q: %w", name, err)
	}
	return nil
}

// CreateCDC prepares the schema for a CDCRelay: it creates the publication
// of outbox_event (inserts only) and the replication slot (pgoutput) when
// they are missing, then puts every unpublished event the stream will not
// deliver (written before the slot existed) into the pending set, where
// the CDC relay's polling half publishes it. slot "" is DefaultSlot of
// the Admin's schema. It is idempotent: run it at deploy time, before the
// Writers switch to WriterConfig.CDC. It needs a role with the REPLICATION
// attribute (or a superuser) and, for the publication, ownership of
// outbox_event; and a server with wal_level = logical (else an error
// wrapping ErrWALLevel).
//
// A slot keeps every WAL segment its consumer has not confirmed: a slot
// whose relays stopped for good fills the disk. Set max_slot_wal_keep_size
// (see the package doc), watch the slot's lag (Metrics), and DropCDC a
// slot you no longer use.
func (a *Admin) CreateCDC(ctx context.Context, slot string) error {
	slot, err := a.slot(slot)
	if err != nil {
		return err
	}
	if err := checkWALLevel(ctx, a.pool); err != nil {
		return err
	}
	var exists bool
	if err := a.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, slot).Scan(&exists); err != nil {
		return fmt.Errorf("outbox: create CDC: %w", err)
	}
	if !exists {
		_, err := a.pool.Exec(ctx, fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')`, sqlident.Quote(slot), a.cdc.events))
		var pgErr *pgconn.PgError
		if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42710") {
			return fmt.Errorf("outbox: create publication %q: %w", slot, err)
		}
	}
	have, err := slots(ctx, a.pool, slot)
	if err != nil {
		return err
	}
	if len(have) == 0 {
		if err := createSlot(ctx, a.pool, slot); err != nil {
			return err
		}
	}
	// After the slot exists: what committed before it is in the log and
	// goes out by state; what commits after is in the stream (an event in
	// both is published twice, never lost).
	if _, err := a.pool.Exec(ctx, a.cdc.backfill); err != nil {
		return fmt.Errorf("outbox: create CDC: queue the unpublished events: %w", err)
	}
	return nil
}

// DropCDC drops the replication slot (and its recovery twin) and the
// publication that CreateCDC created, then puts every unpublished event
// into the pending set, so that a polling Relay publishes what the stream
// had not: switch the Writers back to polling, stop the CDC relays, then
// DropCDC. slot "" is DefaultSlot of the Admin's schema. Missing objects
// are skipped. A slot in use by a running CDC relay cannot be dropped.
func (a *Admin) DropCDC(ctx context.Context, slot string) error {
	slot, err := a.slot(slot)
	if err != nil {
		return err
	}
	for _, name := range slotPair(slot) {
		if err := dropSlot(ctx, a.pool, name); err != nil {
			return err
		}
	}
	if _, err := a.pool.Exec(ctx, `DROP PUBLICATION IF EXISTS `+sqlident.Quote(slot)); err != nil {
		return fmt.Errorf("outbox: drop publication %q: %w", slot, err)
	}
	if _, err := a.pool.Exec(ctx, a.cdc.backfill); err != nil {
		return fmt.Errorf("outbox: drop CDC: queue the unpublished events: %w", err)
	}
	return nil
}

// SlotStats describes a CDC relay group's replication slot.
type SlotStats struct {
	// Name is the slot's name; empty when it does not exist.
	Name string
	// Active says a CDC relay streams from it now.
	Active bool
	// WALStatus is pg_replication_slots.wal_status: reserved or extended
	// (healthy), unreserved (past max_slot_wal_keep_size: about to be
	// invalidated), lost (invalidated: the next CDC relay to start
	// recovers by state).
	WALStatus string
	// LagBytes is how much WAL the server holds for the slot: from the
	// position the relays confirmed to the server's current position.
	LagBytes int64
}

// SlotStats reports the state of the CDC replication slot (slot "" is
// DefaultSlot of the Admin's schema); a zero SlotStats when it does not
// exist. It is cheap enough for a metrics scrape.
func (a *Admin) SlotStats(ctx context.Context, slot string) (SlotStats, error) {
	slot, err := a.slot(slot)
	if err != nil {
		return SlotStats{}, err
	}
	have, err := slots(ctx, a.pool, slot)
	if err != nil || len(have) == 0 {
		return SlotStats{}, err
	}
	s := have[0]
	for _, h := range have[1:] { // mid-recovery: report the healthy one
		if s.lost() && !h.lost() {
			s = h
		}
	}
	return SlotStats{Name: s.name, Active: s.active, WALStatus: s.walStatus, LagBytes: s.lagBytes}, nil
}

func (a *Admin) slot(slot string) (string, error) {
	if slot == "" {
		return DefaultSlot(a.cdc.schema), nil
	}
	if !slotName.MatchString(slot) {
		return "", configError("CDC slot name %q: use 1-61 lower-case letters, digits or underscores", slot)
	}
	return slot, nil
}
