package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/outbox"
)

// outboxCDCCmd is `millrace outbox cdc`: the publication and replication
// slot of the CDC relays (outbox.Admin's CreateCDC, DropCDC, SlotStats).
func (a *app) outboxCDCCmd() *cobra.Command {
	var slot string
	cmd := group(&cobra.Command{
		Use:   "cdc",
		Short: "Change data capture: the publication and replication slot the CDC relays stream from",
		Long: "The publication and replication slot of a CDC relay group (see the outbox package doc, \"Change data capture\").\n" +
			"A slot keeps every WAL segment its relays have not confirmed: drop the slot of a group you retire.",
	})
	cmd.PersistentFlags().StringVar(&slot, "slot", "", "slot and publication name (default millrace_<schema>)")
	cmd.AddCommand(&cobra.Command{
		Use:   "create",
		Short: "Create the publication and the slot (idempotent; needs wal_level = logical and the REPLICATION attribute)",
		Long: "Create the publication of outbox_event and the replication slot when they are missing, then queue for\n" +
			"the CDC relay's polling half every unpublished event written before the slot. Run it before the Writers\n" +
			"switch to CDC. Running it again is safe.",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			admin, err := a.outboxAdmin(cmd.Context())
			if err != nil {
				return err
			}
			if err := admin.CreateCDC(cmd.Context(), slot); err != nil {
				return err
			}
			name := slotOf(slot, a.schema)
			return a.emit(map[string]string{"created": name}, func(w io.Writer) {
				fmt.Fprintf(w, "CDC publication and replication slot %s ready\n", name)
			})
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "drop",
		Short: "Drop the slot and the publication; queue what the slot held for polling relays",
		Long: "Drop the replication slot (and its recovery twin) and the publication, then queue every unpublished\n" +
			"event for the polling Relay. Switch the Writers back to polling and stop the CDC relays first: a slot\n" +
			"in use cannot be dropped. Missing objects are skipped.",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			admin, err := a.outboxAdmin(cmd.Context())
			if err != nil {
				return err
			}
			if err := admin.DropCDC(cmd.Context(), slot); err != nil {
				return err
			}
			name := slotOf(slot, a.schema)
			return a.emit(map[string]string{"dropped": name}, func(w io.Writer) {
				fmt.Fprintf(w, "CDC publication and replication slot %s dropped\n", name)
			})
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "status",
		Short: "The slot: whether a relay streams from it, the WAL it holds, the age of the oldest unpublished event",
		Long: "Show the replication slot: ACTIVE (a CDC relay streams from it), LAG (the WAL the server holds for it),\n" +
			"AGE (how long the oldest unpublished event of the log has waited), INVALIDATED (the server dropped its\n" +
			"WAL past max_slot_wal_keep_size; the next CDC relay to start recovers). Alert on LAG and AGE.",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			admin, err := a.outboxAdmin(cmd.Context())
			if err != nil {
				return err
			}
			s, err := admin.SlotStats(cmd.Context(), slot)
			if err != nil {
				return err
			}
			out := cdcStatus{Slot: slotOf(slot, a.schema), Exists: s.Name != ""}
			if out.Exists {
				oldest, err := a.oldestUnpublished(cmd.Context())
				if err != nil {
					return err
				}
				out.Slot, out.Active, out.WALStatus, out.LagBytes = s.Name, s.Active, s.WALStatus, s.LagBytes
				out.AgeSeconds, out.Invalidated = oldest.Seconds(), s.WALStatus == "lost"
			}
			return a.emit(out, func(w io.Writer) {
				if !out.Exists {
					fmt.Fprintf(w, "no CDC replication slot %s (create it with: millrace outbox cdc create)\n", out.Slot)
					return
				}
				table(w, []string{"SLOT", "ACTIVE", "WAL STATUS", "LAG BYTES", "AGE", "INVALIDATED"},
					[][]string{{out.Slot, strconv.FormatBool(out.Active), out.WALStatus, strconv.FormatInt(out.LagBytes, 10),
						age(oldest(out.AgeSeconds)), strconv.FormatBool(out.Invalidated)}})
			})
		},
	})
	return cmd
}

// cdcStatus is the JSON shape of `outbox cdc status`.
type cdcStatus struct {
	Slot        string  `json:"slot"`
	Exists      bool    `json:"exists"`
	Active      bool    `json:"active"`
	WALStatus   string  `json:"wal_status"`
	LagBytes    int64   `json:"lag_bytes"`
	AgeSeconds  float64 `json:"age_seconds"`
	Invalidated bool    `json:"invalidated"`
}

func oldest(seconds float64) time.Duration { return time.Duration(seconds * float64(time.Second)) }

// slotOf is the slot name the Admin uses for slot.
func slotOf(slot, schema string) string {
	if slot == "" {
		return outbox.DefaultSlot(schema)
	}
	return slot
}

// oldestUnpublished returns how long the oldest unpublished (and not
// discarded) event of the log has waited, 0 when there is none: what a CDC
// slot holds unconfirmed is among those. It walks
// outbox_event_created_at_idx from the oldest event to the first one
// unpublished, over the published events retention keeps: a command's
// query, not a scrape's.
func (a *app) oldestUnpublished(ctx context.Context) (time.Duration, error) {
	schema, err := sqlident.Schema(a.schema)
	if err != nil {
		return 0, err
	}
	var secs float64
	err = a.pool.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(extract(epoch FROM now() - (
    SELECT created_at FROM %s WHERE published_at IS NULL AND discarded_at IS NULL ORDER BY created_at LIMIT 1)), 0)::float8`,
		sqlident.Table(schema, "outbox_event"))).Scan(&secs)
	if err != nil {
		return 0, fmt.Errorf("read the oldest unpublished event: %w", err)
	}
	return oldest(secs), nil
}
