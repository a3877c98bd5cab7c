// Package childtest runs a test binary's helper test in a child process and
// kills it with SIGKILL at a point the child announces: the crash tests of
// the inbox and the participants share it.
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
// where it is to be killed; then it waits.
const Ready = "READY"

// Announce prints Ready for the parent. Call it in the child, then block.
func Announce() { fmt.Println(Ready) }

// KillAtReady runs the test named test of this test binary in a child
// process with env added to its environment, waits up to timeout for it to
// print Ready, kills it with SIGKILL and waits for it to end. It fails t if
// the child ends or times out before it is ready.
func KillAtReady(t testing.TB, test string, env []string, timeout time.Duration) {
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
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), Ready) {
				ready <- true
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		close(ready)
	}()
	select {
	case ok := <-ready:
		if !ok {
			_ = cmd.Wait()
			t.Fatalf("child %s exited before it was ready", test)
		}
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child %s was not ready in %s", test, timeout)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for range ready {
	}
}
