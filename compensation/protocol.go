package compensation

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/pipeline"
	"github.com/millrace/millrace/outbox"
)

// errUnsupportedProtocol is the reason of a command whose
// core.MetadataSagaProtocol names a version this participant does not
// speak. Such a command is not an error of the handler: it is answered
// with a failure reply whose reason starts with "unsupported
// saga_protocol", nothing runs and nothing is written to the barrier, so
// the orchestrator sees at once why its step failed, and a command of a
// known version for the same step runs as if the refused one had never
// come (docs/protocol.md, "Versions").
var errUnsupportedProtocol = errors.New("unsupported saga_protocol")

// checkProtocol returns an error wrapping errUnsupportedProtocol when md
// names a saga protocol version this participant does not speak.
func checkProtocol(md map[string]string) error {
	v := md[core.MetadataSagaProtocol]
	if core.SupportedSagaProtocol(v) {
		return nil
	}
	return fmt.Errorf("%w %q: this participant speaks version %s", errUnsupportedProtocol, v, core.SagaProtocolVersion)
}

// refuseTx answers commands of an unsupported protocol version in tx: a
// failure reply each, through the outbox, and nothing else.
func (p *Participant) refuseTx(ctx context.Context, tx pgx.Tx, items ...*item) error {
	events := make([]outbox.Event, len(items))
	for i, it := range items {
		p.logger.Error("Command of an unsupported saga protocol version refused", errUnsupportedProtocol, watermill.LogFields{
			"saga_id": it.call.SagaID, "step": it.call.Step, "operation": it.call.Operation, "reason": it.unsupported})
		events[i] = p.replyEvent(it.call, reply{outcome: core.OutcomeFailure, reason: it.unsupported, payload: emptyReply})
	}
	return pipeline.WriteLast(ctx, tx, nil, fmt.Sprintf("compensation: %s: refuse %d command(s)", p.name, len(items)), func(wtx pgx.Tx) error {
		_, err := p.writer.WriteTx(ctx, wtx, events...)
		return err
	})
}

// withoutRefused returns the items of a supported protocol version, and
// the others.
func withoutRefused(items []*item) (supported, refused []*item) {
	for _, it := range items {
		if it.unsupported != "" {
			refused = append(refused, it)
		} else {
			supported = append(supported, it)
		}
	}
	return supported, refused
}
