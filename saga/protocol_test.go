package saga_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

// Every command carries the protocol version; a reply of a version the
// orchestrator does not speak is refused as malformed (permanent
// ErrBadReply: the poison topic), and changes nothing; the same reply
// without the header, or with version 1, is applied.
func TestProtocolVersionOfCommandsAndReplies(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	id := "protocol-1"
	start(t, d.testBundle, def, id, 5)
	var v string
	err := d.db.Pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT headers->>'saga_protocol' FROM %s
 WHERE partition_key = $1 AND headers ? 'saga_operation' ORDER BY id LIMIT 1`, d.tbl("outbox_event")), id).Scan(&v)
	if err != nil || v != core.SagaProtocolVersion {
		t.Fatalf("the command's saga_protocol is %q (%v), want %q", v, err, core.SagaProtocolVersion)
	}

	credit := d.last(id)
	for _, bad := range []string{"2", "01", "x"} {
		msg := replyMsg(id, credit, core.OutcomeSuccess, "", `{}`)
		msg.Metadata.Set(core.MetadataSagaProtocol, bad)
		err := d.handler(msg)
		if !errors.Is(err, saga.ErrBadReply) || !core.IsPermanent(err) {
			t.Fatalf("reply of version %q: %v, want a permanent ErrBadReply", bad, err)
		}
	}
	if c := d.last(id); c != credit {
		t.Fatalf("a refused reply moved the saga: last command %+v, was %+v", c, credit)
	}
	msg := replyMsg(id, credit, core.OutcomeSuccess, "", `{}`)
	msg.Metadata.Set(core.MetadataSagaProtocol, "1")
	d.deliver(msg)
	if c := d.last(id); c.Step == credit.Step {
		t.Fatalf("the version 1 reply was not applied: last command %+v", c)
	}
}
