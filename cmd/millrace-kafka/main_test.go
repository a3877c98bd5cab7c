package main

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/leaktest"
	"github.com/millrace/millrace/kafka"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// TestBinary builds the command, runs it on a free port, produces and
// consumes a message through it, and stops it with SIGTERM.
func TestBinary(t *testing.T) {
	t.Parallel()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the binary: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "millrace-kafka")
	build := exec.Command(gobin, "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-port", "0", "-partitions", "2")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	defer func() {
		if !exited {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()

	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var addr string
	select {
	case addr = <-lines:
	case <-time.After(30 * time.Second):
		t.Fatalf("no address on stdout within 30s; stderr: %s", stderr.String())
	}
	if host, port, err := net.SplitHostPort(addr); err != nil || host != "127.0.0.1" || port == "0" {
		t.Fatalf("first stdout line %q is not a 127.0.0.1 address with a real port (%v)", addr, err)
	}

	brokers := []string{addr}
	topic := kafkatest.Topic()
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sent := message.NewMessage("0190c2a4-0000-7000-8000-000000000001", []byte(`{"hello":"binary"}`))
	sent.Metadata.Set(core.MetadataPartitionKey, "k")
	err = pub.Publish(topic, sent)
	pub.Close()
	if err != nil {
		t.Fatal(err)
	}

	sub := kafkatest.NewSubscriber(t, brokers)
	subCtx, subCancel := context.WithTimeout(ctx, 60*time.Second)
	ch, err := sub.Subscribe(subCtx, topic)
	if err != nil {
		t.Fatal(err)
	}
	var got *message.Message
	select {
	case got = <-ch:
	case <-subCtx.Done():
	}
	if got != nil {
		got.Ack()
	}
	subCancel()
	// Closed now, before the broker stops, not only when the test ends.
	if err := sub.Close(); err != nil {
		t.Error(err)
	}
	if got == nil {
		t.Fatal("no message consumed through the binary's broker")
	}
	if got.UUID != sent.UUID || string(got.Payload) != string(sent.Payload) {
		t.Fatalf("consumed %s %q, want %s %q", got.UUID, got.Payload, sent.UUID, sent.Payload)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		exited = true
		if err != nil {
			t.Fatalf("after SIGTERM: %v (exit code %d); stderr: %s", err, cmd.ProcessState.ExitCode(), stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the binary did not exit within 30s of SIGTERM")
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
}
