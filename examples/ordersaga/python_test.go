package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/devkafka"
	"github.com/millrace/millrace/internal/pgtest"
)

// The order saga with its payment service in Python (payment.py, as make
// demo-polyglot runs it), with every fault and the Python process killed
// once mid-run: every check of the demo holds.
func TestOrderSagaWithPythonPayment(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(root, "scripts", "python-venv.sh")).Output()
	if err != nil {
		t.Fatalf("scripts/python-venv.sh: %v", err)
	}
	py := strings.TrimSpace(string(out))
	log, sum := &syncBuffer{}, &syncBuffer{}
	cfg := config{
		DatabaseURL: pgtest.URL(), Brokers: devkafka.EnvBrokers(), Service: "all", Name: "ordersaga_py_" + randomHex(4),
		Sagas: 60, Seed: 7, Writers: 4, Conns: 3, Rate: 30, Faults: true, Timeout: 90 * time.Second, Log: log, Out: sum,
		PaymentCmd: "PYTHONPATH='" + filepath.Join(root, "python") + "' '" + py + "' '" + filepath.Join(root, "examples", "ordersaga", "payment.py") + "'",
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("progress:\n%s\nsummary:\n%s", log.String(), sum.String())
		}
		admin, err := pgtest.Connect(context.Background(), pgtest.URL(), 1)
		if err != nil {
			return
		}
		defer admin.Close()
		for _, s := range (names{cfg.Name}).schemas() {
			_, _ = admin.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{s}.Sanitize()+` CASCADE`)
		}
	})
	res, err := run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	res.print(sum)
	for _, c := range res.checks {
		if !c.ok {
			t.Errorf("check %q failed: %s", c.name, c.detail)
		}
	}
	if !res.ok() || len(res.checks) != 7 {
		t.Errorf("ok = %t with %d checks, want true with 7", res.ok(), len(res.checks))
	}
	for _, s := range []string{
		"payment.py: payment (Python) consuming",
		"fault: payment: the Python process is killed (SIGKILL)",
		"payment.py: fault: payment: release of " + newPlan(cfg.Sagas, cfg.Seed).flakyRelease + "'s credit fails (2 of 2",
	} {
		if !strings.Contains(log.String(), s) {
			t.Errorf("progress output lacks %q", s)
		}
	}
}
