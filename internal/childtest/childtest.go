// Package childtest runs a test binary's helper test in a child process,
// waits for the point the child announces, and kills it there with SIGKILL
// or stops it with SIGTERM: the crash tests of the outbox, the inbox and
// the participants share it.
package childtest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Ready is the line a child prints, alone, when it has reached the point
// where it is to be killed or stopped; then it waits.
const Ready = "READY"

// Announce prints Ready for the parent. Call it in the child, then block.
func Announce() { fmt.Println(Ready) }

// Child is a helper test running in a child process, past its Ready line.
type Child struct {
	name   string
	cmd    *exec.Cmd
	ready  chan bool
	exited chan struct{}
	err    error // cmd.Wait's, once exited is closed
}

// Start runs the test named test of this test binary in a child process
// with env added to its environment and waits up to timeout for it to
// print Ready. It fails t if the child ends or times out before it is
// ready. A child still running when the test ends is killed then.
func Start(t testing.TB, test string, env []string, timeout time.Duration) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &Child{name: test, cmd: cmd, ready: make(chan bool, 1), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), Ready) {
				c.ready <- true
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		close(c.ready)
		c.err = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.exited
	})
	select {
	case ok := <-c.ready:
		if !ok {
			<-c.exited
			t.Fatalf("child %s exited before it was ready: %v", test, c.err)
		}
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-c.exited
		t.Fatalf("child %s was not ready in %s", test, timeout)
	}
	return c
}

// Kill kills the child with SIGKILL and waits for it to end.
func (c *Child) Kill(t testing.TB) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-c.exited
}

// Stop sends the child SIGTERM and waits up to timeout for it to end. It
// fails t if the child does not end in time or ends with an error.
func (c *Child) Stop(t testing.TB, timeout time.Duration) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.exited:
		if c.err != nil {
			t.Fatalf("child %s stopped with %v", c.name, c.err)
		}
	case <-time.After(timeout):
		t.Fatalf("child %s did not stop within %s of SIGTERM", c.name, timeout)
	}
}

// KillAtReady runs the test named test of this test binary in a child
// process with env added to its environment, waits up to timeout for it to
// print Ready, kills it with SIGKILL and waits for it to end. It fails t if
// the child ends or times out before it is ready.
func KillAtReady(t testing.TB, test string, env []string, timeout time.Duration) {
	t.Helper()
	Start(t, test, env, timeout).Kill(t)
}
