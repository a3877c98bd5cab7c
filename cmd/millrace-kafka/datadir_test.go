package main

import (
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/millrace/millrace/internal/kafkatest"
)

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// Without -data-dir the binary keeps its data in millrace-kafka-PORT in the
// temporary directory: restarted on the same port, after SIGKILL, it still
// has its topics and records, so franz-go clients do not meet a topic made
// again under a new id (UNKNOWN_TOPIC_ID).
func TestDefaultDataDirKeepsTopicsAcrossRestart(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	tmp := t.TempDir()
	env := []string{"TMPDIR=" + tmp}
	port := freePort(t)
	addr, cmd := runBrokerEnv(t, bin, env, "-port", port, "-partitions", "3")
	brokers := []string{addr}
	topic := kafkatest.Topic()
	publishN(t, brokers, topic, 0, 20)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if matches, _ := filepath.Glob(filepath.Join(tmp, "millrace-kafka-"+port, "*")); len(matches) == 0 {
		t.Fatalf("nothing written to %s", filepath.Join(tmp, "millrace-kafka-"+port))
	}

	runBrokerEnv(t, bin, env, "-port", port, "-partitions", "3")
	if n := kafkatest.RecordCount(t, brokers, topic); n != 20 {
		t.Fatalf("topic holds %d records after a restart without -data-dir, want the 20 acknowledged", n)
	}
	publishN(t, brokers, topic, 20, 5)
	if n := kafkatest.RecordCount(t, brokers, topic); n != 25 {
		t.Fatalf("topic holds %d records, want 25", n)
	}
}

// -in-memory keeps nothing, and -h says what that costs.
func TestInMemoryForgetsAndHelpSaysSo(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	out, _ := exec.Command(bin, "-h").CombinedOutput()
	for _, want := range []string{"-in-memory", "UNKNOWN_TOPIC_ID", "-data-dir", "millrace-kafka-PORT"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("-h does not mention %q:\n%s", want, out)
		}
	}
	tmp := t.TempDir()
	env := []string{"TMPDIR=" + tmp}
	port := freePort(t)
	addr, cmd := runBrokerEnv(t, bin, env, "-port", port, "-in-memory")
	publishN(t, []string{addr}, kafkatest.Topic(), 0, 1)
	cmd.Process.Kill()
	cmd.Wait()
	if matches, _ := filepath.Glob(filepath.Join(tmp, "*")); len(matches) != 0 {
		t.Fatalf("-in-memory wrote %v", matches)
	}
}
