package cli

import (
	"context"
	"regexp"
	"testing"

	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/outbox"
)

func TestOutboxCDC(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	slot := outbox.DefaultSlot(db.Schema) // slots are server-wide: one per test schema
	admin, err := outbox.NewAdmin(db.Pool, outbox.AdminConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := admin.DropCDC(context.Background(), ""); err != nil {
			t.Errorf("DropCDC: %v", err)
		}
	})

	var st cdcStatus
	okJSON(t, db, &st, "outbox", "cdc", "status")
	if st != (cdcStatus{Slot: slot}) {
		t.Fatalf("status before create = %+v", st)
	}
	if out := ok(t, db, "outbox", "cdc", "status"); !regexp.MustCompile(`^no CDC replication slot ` + slot + ` \(create it with: millrace outbox cdc create\)\n$`).MatchString(out) {
		t.Errorf("human status before create: %q", out)
	}

	opstest.Write(t, db, "orders", 2) // written before the slot: queued for the polling half
	if out := ok(t, db, "outbox", "cdc", "create"); out != "CDC publication and replication slot "+slot+" ready\n" {
		t.Errorf("create printed %q", out)
	}
	ok(t, db, "outbox", "cdc", "create") // idempotent
	if s := outboxStatsOf(t, db); s.Pending != 2 {
		t.Errorf("pending after create = %d, want the 2 events written before the slot", s.Pending)
	}

	okJSON(t, db, &st, "outbox", "cdc", "status")
	if st.Slot != slot || !st.Exists || st.Active || st.Invalidated || st.LagBytes < 0 || st.AgeSeconds <= 0 ||
		(st.WALStatus != "reserved" && st.WALStatus != "extended") {
		t.Errorf("status after create = %+v, want an inactive healthy slot and the age of the 2 unpublished events", st)
	}
	out := ok(t, db, "outbox", "cdc", "status")
	if !regexp.MustCompile(`SLOT\s+ACTIVE\s+WAL STATUS\s+LAG BYTES\s+AGE\s+INVALIDATED\n` + slot + `\s+false\s+(reserved|extended)\s+\d+\s+\S+\s+false\n$`).MatchString(out) {
		t.Errorf("human status:\n%s", out)
	}
	var stats outbox.SlotStats
	if stats, err = admin.SlotStats(context.Background(), ""); err != nil || stats.Name != slot {
		t.Fatalf("SlotStats after create = %+v, %v", stats, err)
	}

	fails(t, db, 1, `CDC slot name "Bad-Slot"`, "outbox", "cdc", "status", "--slot", "Bad-Slot")

	if out := ok(t, db, "outbox", "cdc", "drop", "--json"); compact([]byte(out)) != `{"dropped":"`+slot+`"}` {
		t.Errorf("drop --json printed %q", out)
	}
	if stats, err = admin.SlotStats(context.Background(), ""); err != nil || stats != (outbox.SlotStats{}) {
		t.Errorf("SlotStats after drop = %+v, %v, want no slot", stats, err)
	}
	okJSON(t, db, &st, "outbox", "cdc", "status")
	if st.Exists {
		t.Errorf("status after drop = %+v", st)
	}
	ok(t, db, "outbox", "cdc", "drop") // missing objects are skipped
}
