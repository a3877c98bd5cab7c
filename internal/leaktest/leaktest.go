// Package leaktest checks that a test binary leaves no goroutines behind.
package leaktest

import (
	"testing"

	"go.uber.org/goleak"
)

// Options are the goroutines that libraries millrace uses start once per
// process and never stop; they are not leaks of ours.
var Options = []goleak.Option{
	// sarama's metrics registry (go-metrics) runs one ticker per process.
	goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"),
	goleak.IgnoreAnyFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"),
	// A sarama producer whose circuit breaker opened during a broker outage
	// leaves the breaker's timer sleeping for up to 10 s after Close.
	goleak.IgnoreAnyFunction("github.com/eapache/go-resiliency/breaker.(*Breaker).timer"),
	// Watermill's conformance suite (pubsub/tests) fans many subscribers of
	// a topic into one channel through its internal multiplier. With an
	// at-least-once subscriber, a redelivery that arrives after the suite
	// stopped reading leaves the multiplier's forwarding goroutine blocked
	// on that channel for good, and its closer waiting on it: goroutines of
	// the suite, not of the code under test.
	goleak.IgnoreAnyFunction("github.com/ThreeDotsLabs/watermill/internal/subscriber.(*multiplier).Subscribe.func2"),
	goleak.IgnoreAnyFunction("github.com/ThreeDotsLabs/watermill/internal/subscriber.(*multiplier).Subscribe.func3"),
}

// VerifyTestMain runs the tests and then fails the binary if goroutines leaked.
// Use it as the body of TestMain.
func VerifyTestMain(m *testing.M) { goleak.VerifyTestMain(m, Options...) }
