// Package sagahook names the persistence boundaries of the saga
// orchestrator where a test harness injects crashes: saga.Config.Hook,
// set by the sagatest harness and the saga package's own tests. It is
// internal: a service has no use for it.
package sagahook

import (
	"context"
	"fmt"
)

// Point names a persistence boundary of the orchestrator, where a Func is
// called.
type Point int

const (
	// Loaded: a saga row is read and locked in the transaction, and (for
	// a reply) the reply decoded; nothing is written yet. Between reading
	// a reply and writing the next command.
	Loaded Point = iota + 1
	// BeforeCommit: the saga's new state, history and commands are
	// written in the transaction, which is about to commit.
	BeforeCommit
	// AfterCommit: the transaction committed.
	AfterCommit
)

func (p Point) String() string {
	switch p {
	case Loaded:
		return "loaded"
	case BeforeCommit:
		return "before-commit"
	case AfterCommit:
		return "after-commit"
	}
	return fmt.Sprintf("Point(%d)", int(p))
}

// Func is called at each Point with the saga's id. An error returned
// before the commit rolls the transaction back (as a crash there would; in
// a timer pass, that saga's part of it, as for any technical failure of
// its timer); an error after the commit is returned to the caller (a reply
// is then redelivered and deduplicated).
type Func func(ctx context.Context, point Point, sagaID string) error
