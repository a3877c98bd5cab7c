package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The payment service in Python (-payment-cmd, make demo-polyglot): the
// demo makes payment's schemas, seeds its accounts and runs the relay that
// ships its outbox, as for the Go service, and runs payment.py, on the
// millrace package of python/, as the participant instead of a
// compensation.Participant. With faults on, the Python process is killed
// (SIGKILL) once a third of the credit is reserved, and started again: the
// commands it had not committed come again, and the barrier and the inbox
// keep each effect once.

// startPythonPayment sets up payment's service as startPayment does and
// starts cfg.PaymentCmd, a shell command that runs payment.py.
func startPythonPayment(ctx context.Context, cfg config, lg *logger, plan *plan, seed func(context.Context, *service) error) (*participant, error) {
	n := names{cfg.Name}
	s, err := newService(ctx, cfg, "payment", paymentDDL, lg)
	if err != nil {
		return nil, err
	}
	if err := seed(ctx, s); err != nil {
		s.close()
		return nil, fmt.Errorf("payment: seed: %w", err)
	}
	flaky := ""
	if cfg.Faults {
		flaky = plan.flakyRelease
	}
	proc := &pyPayment{cmd: cfg.PaymentCmd, lg: lg, s: s, env: []string{
		"DATABASE_URL=" + cfg.DatabaseURL, "KAFKA_BROKERS=" + strings.Join(cfg.Brokers, ","),
		"PAYMENT_SCHEMA=" + s.schema, "MILLRACE_SCHEMA=" + s.mschema,
		"PAYMENT_TOPIC=" + n.commands("payment"), "PAYMENT_GROUP=" + n.group("payment"), "FLAKY_RELEASE=" + flaky,
	}}
	if err := proc.start(); err != nil {
		s.close()
		return nil, err
	}
	lg.say("payment: the Python service (%s)", cfg.PaymentCmd)
	fctx, stopFaults := context.WithCancel(context.Background())
	var faults sync.WaitGroup
	if cfg.Faults {
		faults.Add(1)
		go func() { defer faults.Done(); proc.killOnce(fctx, s, cfg.Sagas/3) }()
	}
	s.consumer = func() { stopFaults(); faults.Wait(); proc.stop() }
	s.start() // the relay (and retention) of the Python service's schema
	return &participant{service: s}, nil
}

// pyPayment is payment.py's process.
type pyPayment struct {
	cmd string
	env []string
	lg  *logger
	s   *service

	mu sync.Mutex
	c  *exec.Cmd
}

func (p *pyPayment) start() error {
	c := exec.Command("/bin/sh", "-c", p.cmd)
	c.Env = append(os.Environ(), p.env...)
	out, err := c.StdoutPipe()
	if err != nil {
		return err
	}
	c.Stderr = c.Stdout
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		return fmt.Errorf("payment: start %q: %w", p.cmd, err)
	}
	go p.forward(out)
	p.mu.Lock()
	p.c = c
	p.mu.Unlock()
	return nil
}

// forward writes the process's lines to the demo's log, but for its
// "deliveries N" lines, the commands it has been handed since it started,
// which it adds to the service's deliveries (the demo's checks compare
// deliveries with inbox marks).
func (p *pyPayment) forward(r io.Reader) {
	sc := bufio.NewScanner(r)
	var seen int64
	for sc.Scan() {
		if n, err := strconv.ParseInt(strings.TrimPrefix(sc.Text(), "deliveries "), 10, 64); err == nil {
			p.s.deliveredP.Add(n - seen)
			seen = n
			continue
		}
		p.lg.say("payment.py: %s", sc.Text())
	}
}

// killOnce kills the process once at reserved credit reservations, and
// starts it again.
func (p *pyPayment) killOnce(ctx context.Context, s *service, reserved int) {
	for ctx.Err() == nil {
		var n int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM credit_ledger WHERE kind = 'reserve'`).Scan(&n); err == nil && n >= reserved {
			p.mu.Lock()
			c := p.c
			p.mu.Unlock()
			p.lg.fault("payment: the Python process is killed (SIGKILL) after %d credit reservations, and started again", n)
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL) // the shell and payment.py
			_ = c.Wait()
			if err := p.start(); err != nil {
				p.lg.say("payment: %v", err)
			}
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stop ends the process: SIGTERM, then SIGKILL after 10 seconds.
func (p *pyPayment) stop() {
	p.mu.Lock()
	c := p.c
	p.mu.Unlock()
	_ = syscall.Kill(-c.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		<-done
	}
}
