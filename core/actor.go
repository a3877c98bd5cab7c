package core

import "errors"

// Actor says who takes an operator action, why, and from where. Every
// operator action of millrace's Go API takes one (saga.Orchestrator.Retry
// and the other saga actions, outbox.Admin.Requeue, inbox.DeadLetters.Discard,
// ...), and records it in the audit trail, in the transaction of the action
// (and, for a saga, in its history). Operator and Reason are required.
type Actor struct {
	// Operator names who acts: a person's login, or a service's name.
	// Required.
	Operator string
	// Reason says why. Required.
	Reason string
	// OnBehalfOf names whose plan the action carries out: the operator
	// who planned a bulk action that Operator confirmed (recorded beside
	// Operator, who acts). Defaults to "" (Operator's own).
	OnBehalfOf string
	// From says where the action came from, for the audit trail: the
	// console sets "console" and the client's address, the millrace
	// command "cli" and the host. Defaults to "go".
	From string
	// Operation is the bulk operation the action is part of, if any (set
	// by saga.Orchestrator.Apply). Defaults to "".
	Operation string
	// Revision, when not 0, is the revision of the saga the operator
	// looked at (saga.Instance.Revision) before deciding: the action is
	// refused as stale if the saga changed since, so that nobody acts on a
	// step they never saw. Defaults to 0: act on the saga as it is.
	Revision int64
}

// ErrNoActor is wrapped by the error of an operator action whose Actor
// lacks an Operator or a Reason; nothing was changed.
var ErrNoActor = errors.New("millrace: an operator action needs Actor.Operator and Actor.Reason")
