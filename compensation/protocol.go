package compensation

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millrace/millrace/core"
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
	if v == "" || v == core.SagaProtocolVersion { // absent: version 1, from before the header
		return nil
	}
	return fmt.Errorf("%w %q: this participant speaks version %s", errUnsupportedProtocol, v, core.SagaProtocolVersion)
}

// refused logs a command refused for its protocol version (a poisoned
// one is logged when it is poisoned).
func (p *Participant) refused(it *item) {
	if it.unsupported != "" {
		p.logger.Error("Command of an unsupported saga protocol version refused", errUnsupportedProtocol, watermill.LogFields{
			"saga_id": it.call.SagaID, "step": it.call.Step, "operation": it.call.Operation, "reason": it.unsupported})
	}
}
