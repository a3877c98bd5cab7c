package outbox_test

import (
	"testing"

	"github.com/millrace/millrace/internal/leaktest"
)

// TestMain is the only one of the package (internal and external tests
// share it): it fails the run if goroutines leak.
func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }
