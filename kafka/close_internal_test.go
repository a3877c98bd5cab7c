package kafka

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/goleak"
)

// Close gives up waiting for the call in progress and closes the client;
// that call then renews its client (a topic's limit changed): the new
// client is closed at once, not left running, and the Publisher keeps the
// client Close closed. Not parallel: it checks that no goroutine outlives
// it, and it shortens closeGrace.
func TestCloseDuringAClientRenewalLeaksNoClient(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	b, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	grace := closeGrace
	closeGrace = 10 * time.Millisecond
	defer func() { closeGrace = grace }()
	p, err := NewPublisher(PublisherConfig{Brokers: b.ListenAddrs()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	closed := p.client
	p.sendMu.Lock() // a call in progress
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Close()
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !clientClosed(p) {
		if time.Now().After(deadline) {
			t.Fatal("Close did not close the client after its grace")
		}
		time.Sleep(time.Millisecond)
	}
	p.stale = "a topic's limit changed"
	p.renewClient() // the call's renewal, after Close closed the client
	p.sendMu.Unlock()
	<-done
	if p.client != closed {
		t.Fatal("the Publisher holds a client made after Close")
	}
}

// clientClosed says whether Close closed p's client.
func clientClosed(p *Publisher) bool {
	p.clientMu.Lock()
	defer p.clientMu.Unlock()
	return p.client.Context().Err() != nil
}
