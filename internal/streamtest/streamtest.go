// Package streamtest gives tests a Redis (Streams) and a NATS server
// (JetStream) to talk to: the shared ones scripts/redis-up.sh and
// scripts/nats-up.sh start (REDIS_URL, NATS_URL, as make test passes them),
// or private servers, one per test, started from the binaries those scripts
// install, for tests that kill and restart the server.
//
// Where a binary is missing: a test fails, saying so, when the variable is
// set (make brought the service up, so the binary should be there); when
// neither the variable nor the binary exists it is skipped, naming the
// script that installs it.
package streamtest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RedisURL returns REDIS_URL when set, otherwise the URL of a private
// redis-server for the test.
func RedisURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv("REDIS_URL"); u != "" {
		return u
	}
	return StartRedis(t).URL
}

// NATSURL returns NATS_URL when set, otherwise the URL of a private
// nats-server -js for the test.
func NATSURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	return StartNATS(t).URL
}

// Server is a private server process of one test, on a port and data
// directory of its own; it is killed when the test ends.
type Server struct {
	URL  string
	Port int
	Dir  string

	t     testing.TB
	bin   string
	args  []string
	ready func(addr string) bool
	cmd   *exec.Cmd
	log   *os.File
}

// StartRedis starts redis-server on a free loopback port with the
// append-only file fsynced on every write (appendfsync always: a write
// Redis acknowledged survives SIGKILL) in a directory of the test's, and
// waits until it answers PING.
func StartRedis(t testing.TB) *Server {
	t.Helper()
	bin := binary(t, "redis-server", "REDIS_URL", "scripts/redis-up.sh")
	dir := t.TempDir()
	port := freePort(t)
	s := &Server{
		URL: fmt.Sprintf("redis://127.0.0.1:%d/0", port), Port: port, Dir: dir, t: t, bin: bin,
		args: []string{"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir,
			"--save", "", "--appendonly", "yes", "--appendfsync", "always"},
		ready: redisReady,
	}
	s.start()
	t.Cleanup(s.stop)
	return s
}

// StartNATS starts nats-server with JetStream on a free loopback port, its
// store in a directory of the test's, and waits until it serves.
func StartNATS(t testing.TB) *Server {
	t.Helper()
	bin := binary(t, "nats-server", "NATS_URL", "scripts/nats-up.sh")
	dir := t.TempDir()
	port := freePort(t)
	s := &Server{
		URL: fmt.Sprintf("nats://127.0.0.1:%d", port), Port: port, Dir: dir, t: t, bin: bin,
		args:  []string{"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", filepath.Join(dir, "store")},
		ready: natsReady,
	}
	s.start()
	t.Cleanup(s.stop)
	return s
}

// Kill stops the server with SIGKILL, as a crash would, and waits for it
// to exit.
func (s *Server) Kill() {
	s.t.Helper()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart starts the server again on the same port and data directory and
// waits until it serves.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.start()
}

func (s *Server) start() {
	s.t.Helper()
	if s.log == nil {
		f, err := os.Create(filepath.Join(s.Dir, "server.log"))
		if err != nil {
			s.t.Fatal(err)
		}
		s.log = f
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("streamtest: starting %s: %v", s.bin, err)
	}
	s.cmd = cmd
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
	deadline := time.Now().Add(30 * time.Second)
	for !s.ready(addr) {
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(s.log.Name())
			s.t.Fatalf("streamtest: %s did not serve on %s within 30s; its log:\n%s", s.bin, addr, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *Server) stop() {
	s.Kill()
	if s.log != nil {
		s.log.Close()
	}
}

// binary finds name on PATH (and in /usr/sbin, where Debian puts
// nats-server, which a user's PATH may lack).
func binary(t testing.TB, name, env, script string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/usr/bin", "/usr/local/bin"} {
		if p := filepath.Join(dir, name); isExecutable(p) {
			return p
		}
	}
	if os.Getenv(env) != "" {
		t.Fatalf("streamtest: %s is set but %s is not on PATH: this test kills and restarts a server of its own, started from that binary; %s installs it", env, name, script)
	}
	t.Skipf("no %s on PATH and %s is not set; %s installs and starts it", name, env, script)
	return ""
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// redisReady reports whether Redis at addr answers PING with PONG (not
// -LOADING while it replays its append-only file).
func redisReady(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}

// natsReady reports whether the NATS server at addr sends its INFO line
// with JetStream on.
func natsReady(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "INFO ") && strings.Contains(line, `"jetstream":true`)
}
