package compensation

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
)

// RunBatch is RunBatched's handling of one batch, for the protocol's
// vectors: the permanent errors of the messages it poisoned, by UUID.
func RunBatch(ctx context.Context, p *Participant, msgs []*message.Message) (map[string]error, error) {
	return p.runBatch(ctx, msgs)
}
