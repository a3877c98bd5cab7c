package outbox_test

import (
	"github.com/millrace/millrace/core"

	"testing"

	"github.com/millrace/millrace/internal/leaktest"
)

// TestMain is the only one of the package (internal and external tests
// share it): it fails the run if goroutines leak.
func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// opsActor is who the tests' operator actions are recorded as.
var opsActor = core.Actor{Operator: "ops", Reason: "test"}
