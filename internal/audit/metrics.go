package audit

import (
	"errors"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// actions counts the entries this process recorded, once their
// transaction committed (Count), as millrace_audit_actions_total by
// source (the first word of Actor.From: console, cli, go), kind, action
// and outcome. It is one collector per process: every part that has a
// Registerer registers it (Register), and a second registration on the
// same Registerer is not an error.
var actions = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "millrace", Subsystem: "audit", Name: "actions_total",
	Help: "Operator actions recorded in the audit trail by this process, by source, kind, action and outcome.",
}, []string{"source", "kind", "action", "outcome"})

// Register registers the audit counter with reg; nil reg registers
// nothing.
func Register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	var are prometheus.AlreadyRegisteredError
	if err := reg.Register(actions); err != nil && !errors.As(err, &are) {
		return err
	}
	return nil
}

// Count counts entries whose transaction committed.
func Count(entries ...Entry) {
	for _, e := range entries {
		source, _, _ := strings.Cut(strings.TrimSpace(e.Actor.From), " ")
		if source == "" {
			source = "go"
		}
		outcome := e.Outcome
		if outcome == "" {
			outcome = Done
		}
		actions.WithLabelValues(source, e.Kind, e.Action, outcome).Inc()
	}
}
