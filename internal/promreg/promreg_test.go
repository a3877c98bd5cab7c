package promreg

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

type collector struct{ prometheus.Counter }

type otherCollector struct{ prometheus.Counter }

func newCollector(name string) *collector {
	return &collector{prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: "test"})}
}

// The second registration of a collector of the same type and
// descriptions returns the first; one of another type with the same
// descriptions is refused; a new one is registered.
func TestRegisterSharesTheFirst(t *testing.T) {
	reg := prometheus.NewRegistry()
	first, err := Register(reg, newCollector("a_total"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := Register(reg, newCollector("a_total"))
	if err != nil || second != first {
		t.Fatalf("second Register = %p, %v; want the first (%p)", second, err, first)
	}
	if _, err := Register(reg, &otherCollector{prometheus.NewCounter(prometheus.CounterOpts{Name: "a_total", Help: "test"})}); err == nil {
		t.Fatal("a collector of another type with the same metric was registered")
	}
	other, err := Register(reg, newCollector("b_total"))
	if err != nil || other == first {
		t.Fatalf("Register of another metric = %p, %v; want a new collector", other, err)
	}
}
