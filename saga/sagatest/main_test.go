package sagatest_test

import (
	"testing"

	"github.com/millrace/millrace/internal/leaktest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }
