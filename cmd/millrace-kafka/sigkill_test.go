package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/kafka"
)

// buildBinary builds the command into a directory of the test's.
func buildBinary(t *testing.T) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the binary: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "millrace-kafka")
	if out, err := exec.Command(gobin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// runBroker starts the binary with args and returns its address and the
// process, killed when the test ends if it still runs.
func runBroker(t *testing.T, bin string, args ...string) (string, *exec.Cmd) {
	t.Helper()
	return runBrokerEnv(t, bin, nil, args...)
}

// runBrokerEnv is runBroker with env added to the binary's environment.
func runBrokerEnv(t *testing.T, bin string, env []string, args ...string) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	select {
	case addr, ok := <-lines:
		if !ok {
			t.Fatalf("the broker wrote no address; stderr: %s", stderr.String())
		}
		return addr, cmd
	case <-time.After(30 * time.Second):
		t.Fatalf("no address on stdout within 30s; stderr: %s", stderr.String())
		return "", nil
	}
}

func publishN(t *testing.T, brokers []string, topic string, from, n int) []string {
	t.Helper()
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var msgs []*message.Message
	var ids []string
	for i := from; i < from+n; i++ {
		m := message.NewMessage(fmt.Sprintf("0190c2a4-0000-7000-8000-%012d", i), []byte(`{"n":`+strconv.Itoa(i)+`}`))
		m.Metadata.Set(core.MetadataPartitionKey, "k"+strconv.Itoa(i%7))
		msgs = append(msgs, m)
		ids = append(ids, m.UUID)
	}
	if err := pub.Publish(topic, msgs...); err != nil {
		t.Fatal(err)
	}
	return ids
}

// A broker with -data-dir killed with SIGKILL keeps what it acknowledged:
// after a restart on the same port and directory, an auto-created topic is
// still there with its records, and new records get offsets after them
// instead of overwriting them.
func TestSIGKILLKeepsAutoCreatedTopicsAndRecords(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	dir := t.TempDir()
	addr, cmd := runBroker(t, bin, "-port", "0", "-partitions", "3", "-data-dir", dir)
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	brokers := []string{addr}
	topic := kafkatest.Topic() // auto-created by the first publish
	before := publishN(t, brokers, topic, 0, 100)
	if n := kafkatest.RecordCount(t, brokers, topic); n != 100 {
		t.Fatalf("topic holds %d records before the kill, want 100", n)
	}

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	addr2, _ := runBroker(t, bin, "-port", port, "-partitions", "3", "-data-dir", dir)
	if addr2 != addr {
		t.Fatalf("restarted on %s, want %s", addr2, addr)
	}
	if n := kafkatest.RecordCount(t, brokers, topic); n != 100 {
		t.Fatalf("topic holds %d records after SIGKILL and restart, want the 100 acknowledged", n)
	}
	after := publishN(t, brokers, topic, 100, 10)
	if n := kafkatest.RecordCount(t, brokers, topic); n != 110 {
		t.Fatalf("topic holds %d records, want 110: new offsets must follow the old ones", n)
	}
	got := map[string]bool{}
	for _, m := range kafkatest.Read(t, brokers, topic, 110) {
		got[m.UUID] = true
	}
	for _, id := range append(before, after...) {
		if !got[id] {
			t.Fatalf("message %s missing after the restart", id)
		}
	}
}
