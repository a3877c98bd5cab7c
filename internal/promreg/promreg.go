// Package promreg registers a package's Prometheus collector once per
// Registerer: the parts of a package that register on one Registerer (two
// relays, two orchestrators, several participants) share the collector
// the first one registered.
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c with reg and returns it, or returns the collector
// of c's type that reg holds already (registered by another part of the
// same package). Any other failure to register is returned.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	var zero C
	return zero, err
}
