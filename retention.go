package millrace

import (
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millrace/millrace/internal/retention"
)

// Defaults of Retention.
const (
	// DefaultRetention is how long published outbox events, inbox dedup
	// marks, barrier rows and completed sagas stay after they ended.
	DefaultRetention = retention.DefaultEvents
	// DefaultCompensatedRetention is how long compensated sagas, sagas that
	// were ever stuck, and bulk operations stay: a failure is what someone
	// asks about later.
	DefaultCompensatedRetention = retention.DefaultCompensated
	// DefaultAuditRetention is how long an entry of the audit trail (an
	// operator action) stays.
	DefaultAuditRetention = retention.DefaultAudit
	// DefaultRetentionInterval is the time between two retention passes.
	DefaultRetentionInterval = retention.DefaultInterval
)

// Retention says how long ended rows stay in the service's schema. The
// service removes older ones in small batches, a pass every Interval.
type Retention struct {
	// Events is how long a published (or discarded) outbox event stays,
	// for audit and replay. Defaults to DefaultRetention.
	Events time.Duration
	// Marks is how long an inbox dedup mark (and a processed inbox row)
	// stays. It must outlast the longest redelivery or replay horizon: a
	// duplicate that arrives after its mark was removed is applied again.
	// Defaults to DefaultRetention.
	Marks time.Duration
	// Barrier is how long a saga's barrier rows stay after the last
	// command of that saga reached a participant. It must outlast the
	// longest time a command of the saga can still arrive. Defaults to
	// DefaultRetention.
	Barrier time.Duration
	// Completed is how long a completed saga, its history and its stored
	// events stay. Defaults to DefaultRetention.
	Completed time.Duration
	// Compensated is how long a compensated saga, any saga that was ever
	// stuck (also one that then completed), and a bulk operation stay.
	// Defaults to DefaultCompensatedRetention.
	Compensated time.Duration
	// Audit is how long an entry of the audit trail (who did which
	// operator action, on whose plan, why) stays. Defaults to
	// DefaultAuditRetention (90 days).
	Audit time.Duration
	// Interval is the time between two passes. Defaults to
	// DefaultRetentionInterval.
	Interval time.Duration
	// Off runs no retention in this service: another process does. A
	// Service with NoRelay, no saga registered and no participant runs
	// only retention. Defaults to false.
	Off bool
}

func (r Retention) config(schema string, logger watermill.LoggerAdapter) retention.Config {
	return retention.Config{Schema: schema, Events: r.Events, Marks: r.Marks, Barrier: r.Barrier, Completed: r.Completed,
		Compensated: r.Compensated, Audit: r.Audit, Interval: r.Interval, Logger: logger}
}
