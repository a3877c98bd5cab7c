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
}

// VerifyTestMain runs the tests and then fails the binary if goroutines leaked.
// Use it as the body of TestMain.
func VerifyTestMain(m *testing.M) { goleak.VerifyTestMain(m, Options...) }
