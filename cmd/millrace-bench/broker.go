package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/millrace/millrace/internal/devkafka"
)

// serveBroker is the -serve-broker child: it runs the embedded broker,
// prints its address on stdout and stops when stdin reaches EOF (the parent
// closed it, or died) or ctx ends.
func serveBroker(ctx context.Context, stdin io.Reader, stdout io.Writer) error {
	b, err := devkafka.Start(devkafka.Config{Partitions: 8})
	if err != nil {
		return err
	}
	defer b.Close()
	fmt.Fprintln(stdout, b.Addrs()[0])
	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		close(eof)
	}()
	select {
	case <-eof:
	case <-ctx.Done():
	}
	return nil
}

// brokerProcess is the embedded broker running in a child process.
type brokerProcess struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	addr  string
	done  chan error
}

// child returns a command that runs this binary in a child role.
func child(ctx context.Context, args ...string) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.Stderr = os.Stderr
	cmd.WaitDelay = 5 * time.Second
	return cmd, nil
}

// startBroker starts the -serve-broker child and waits for its address.
func startBroker(ctx context.Context) (*brokerProcess, error) {
	cmd, err := child(context.WithoutCancel(ctx), "-serve-broker")
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start broker process: %w", err)
	}
	bp := &brokerProcess{cmd: cmd, stdin: stdin, done: make(chan error, 1)}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			line <- strings.TrimSpace(sc.Text())
		}
		close(line)
		_, _ = io.Copy(io.Discard, stdout)
		bp.done <- cmd.Wait()
	}()
	select {
	case addr, ok := <-line:
		if ok && addr != "" {
			bp.addr = addr
			return bp, nil
		}
		bp.stop()
		return nil, fmt.Errorf("broker process exited without an address")
	case <-time.After(30 * time.Second):
		bp.stop()
		return nil, fmt.Errorf("broker process gave no address within 30s")
	}
}

// stop closes the broker's stdin, which ends it, and kills it if it has not
// ended within a few seconds.
func (bp *brokerProcess) stop() {
	_ = bp.stdin.Close()
	select {
	case <-bp.done:
	case <-time.After(5 * time.Second):
		_ = bp.cmd.Process.Kill()
		<-bp.done
	}
}
