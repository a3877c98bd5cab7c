package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"
)

// Server is a throwaway PostgreSQL cluster of one test, for tests that
// restart the server or change its settings: the shared server of
// DATABASE_URL must not be disturbed.
type Server struct {
	bin, data, log string
	port           int
	settings       []string
	runAs          []string
}

// StartServer initdbs a cluster into a directory of the test's with the
// PostgreSQL binaries installed under /usr/lib/postgresql (as the postgres
// user when run as root), starts it on a free port with the given extra
// settings ("name=value"), creates database test, and stops it when the
// test ends. initdbArgs are added to initdb's (e.g. "--wal-segsize=1"). It
// skips the test when no binaries are installed.
func StartServer(t testing.TB, initdbArgs []string, settings ...string) *Server {
	t.Helper()
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Strings(dirs)
	if len(dirs) == 0 {
		t.Skip("no PostgreSQL binaries under /usr/lib/postgresql to start a private server")
	}
	s := &Server{bin: dirs[len(dirs)-1], settings: settings}
	dir := t.TempDir()
	if os.Getuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skip("running as root without a postgres user: cannot initdb")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		// The postgres user must reach the directory.
		for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
			_ = os.Chmod(d, 0o755)
		}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		s.runAs = []string{"runuser", "-u", "postgres", "--"}
	}
	s.data, s.log = filepath.Join(dir, "data"), filepath.Join(dir, "log")
	if out, err := s.cmd(append([]string{filepath.Join(s.bin, "initdb"), "-D", s.data, "-U", "postgres", "-A", "trust", "--no-sync"}, initdbArgs...)...).CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	s.pgctl(t, "start")
	t.Cleanup(func() {
		_ = s.cmd(filepath.Join(s.bin, "pg_ctl"), "-D", s.data, "-m", "immediate", "-w", "stop").Run()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := Connect(ctx, s.url("postgres"), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE DATABASE test`); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *Server) cmd(args ...string) *exec.Cmd {
	args = append(append([]string{}, s.runAs...), args...)
	return exec.Command(args[0], args[1:]...)
}

func (s *Server) pgctl(t testing.TB, action string, extra ...string) {
	t.Helper()
	opts := fmt.Sprintf("-p %d -k /tmp -c listen_addresses=127.0.0.1 -c fsync=off", s.port)
	for _, set := range s.settings {
		opts += " -c " + set
	}
	args := append([]string{filepath.Join(s.bin, "pg_ctl"), "-D", s.data, "-l", s.log, "-w", "-o", opts}, extra...)
	if out, err := s.cmd(append(args, action)...).CombinedOutput(); err != nil {
		log, _ := os.ReadFile(s.log)
		t.Fatalf("pg_ctl %s: %v\n%s\n%s", action, err, out, log)
	}
}

// URL is the address of the server's database test.
func (s *Server) URL() string { return s.url("test") }

func (s *Server) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// Restart restarts the server (pg_ctl restart -m fast: connections are
// cut, committed work survives).
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.pgctl(t, "restart", "-m", "fast")
}

// DB returns a pool on the server's database test and a fresh schema with
// every migration applied, dropped when the test ends (while the server
// still runs).
func (s *Server) DB(t testing.TB, maxConns int32) *DB {
	t.Helper()
	pool, err := Connect(context.Background(), s.URL(), maxConns)
	if err != nil {
		t.Fatal(err)
	}
	db := &DB{Pool: pool, Schema: RandomName("t")}
	t.Cleanup(pool.Close)
	if err := db.migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return db
}
