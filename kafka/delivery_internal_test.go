package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A delivered message's context carries its record's position in one
// value: the four getters read it, and building a delivery costs no
// allocation per message for them beyond that value and the cancel.
func TestDeliveryContextHoldsTheRecord(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := &partition{sub: &subscription{s: &Subscriber{cfg: SubscriberConfig{Unmarshaler: DefaultUnmarshaler()}, logger: watermill.NopLogger{}}, ctx: ctx}, id: 7}
	at := time.Unix(1700000000, 0)
	recs := make([]*kgo.Record, 100)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: "t", Partition: 7, Offset: int64(1000 + i), Key: []byte("saga-1"), Timestamp: at, Value: []byte(`{}`),
			Headers: []kgo.RecordHeader{{Key: "_watermill_message_uuid", Value: []byte("0190c0d2-7e2a-7c3e-9d2b-3f4a5b6c7d8e")}, {Key: "saga_id", Value: []byte("saga-1")}}}
	}
	d := p.newDelivery(recs[:1])
	mctx := d.msgs[0].Context()
	r, ok := RecordFromContext(mctx)
	if !ok || r.Partition != 7 || r.Offset != 1000 || !r.Timestamp.Equal(at) || string(r.Key) != "saga-1" {
		t.Errorf("record %+v, %v: want partition 7, offset 1000, the timestamp, key saga-1", r, ok)
	}
	for _, c := range d.cancels {
		c()
	}
	withValues := testing.AllocsPerRun(20, func() {
		base := context.WithValue(ctx, recordKey{}, recs[0])
		_, c := context.WithCancel(base)
		c()
	})
	all := testing.AllocsPerRun(20, func() {
		d := p.newDelivery(recs)
		for _, c := range d.cancels {
			c()
		}
	}) / float64(len(recs))
	t.Logf("%.1f allocations per message, %.0f of them the context's", all, withValues)
	// The rest (15 here) is the Unmarshaler's message and its metadata;
	// four values of their own took six allocations more (24.2).
	if all > withValues+16 {
		t.Errorf("%.1f allocations per message", all)
	}
}
