package kafka

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/millrace/core"
)

// Marshaler turns a Watermill message into the Kafka record a Publisher
// sends: its key, value, headers and timestamp (the Publisher sets the
// topic and chooses the partition from the key). It returns a new record
// on each call.
//
// A message that carries the metadata core.MetadataPartitionKey must be
// keyed by it: the Publisher refuses another key (ErrMarshal, permanent).
// Order is kept per partition key all the way from the outbox (its relay
// publishes a key's events in order, and holds a failed event's later
// events back, by partition key), so a record keyed by another field would
// be ordered only within one Publish call. Messages without it may be keyed
// by anything.
//
// A message of a key is never stored after an earlier one of that key
// that failed, so when Marshal fails the Publisher must know the key the
// message would have had: a Marshaler that can tell returns, with its
// error, a record carrying that key (its other fields are ignored), and
// only that key's later messages of the call are held back. A failure with
// no record holds back every later message of the topic in the call.
type Marshaler interface {
	Marshal(topic string, msg *message.Message) (*kgo.Record, error)
}

// Unmarshaler turns a record a Subscriber fetched into a Watermill
// message. A record it refuses (an error, or no message) is logged and
// skipped.
type Unmarshaler interface {
	Unmarshal(rec *kgo.Record) (*message.Message, error)
}

// uuidHeader is the header that carries the message UUID, as
// watermill-kafka names it.
const uuidHeader = "_watermill_message_uuid"

// DefaultMarshaler returns the Marshaler a Publisher uses when
// PublisherConfig.Marshaler is nil. Its records are what watermill-kafka's
// Publisher writes with its partitioning marshaler keyed by
// core.MetadataPartitionKey, so any watermill-kafka Subscriber reads them:
// the message UUID in the "_watermill_message_uuid" header, each metadata
// entry as a header, the payload as value, and the metadata
// core.MetadataPartitionKey as key (an empty key, not a null one, when it
// is missing: keyless messages share a partition and keep their order). A
// message whose metadata holds "_watermill_message_uuid" is refused.
func DefaultMarshaler() Marshaler { return watermillFormat{} }

// DefaultUnmarshaler returns the Unmarshaler a Subscriber uses when
// SubscriberConfig.Unmarshaler is nil. It reads what DefaultMarshaler and
// watermill-kafka's marshalers write: the UUID from the
// "_watermill_message_uuid" header (empty when missing), every other
// header as metadata (of a repeated header, the last), the value as
// payload. It refuses no record.
func DefaultUnmarshaler() Unmarshaler { return watermillFormat{} }

// watermillFormat is watermill-kafka's record format.
type watermillFormat struct{}

func (watermillFormat) Marshal(_ string, msg *message.Message) (*kgo.Record, error) {
	key := msg.Metadata.Get(core.MetadataPartitionKey)
	r := &kgo.Record{Key: append([]byte{}, key...)}
	if msg.Metadata.Get(uuidHeader) != "" {
		return r, fmt.Errorf("metadata %s is reserved for the message UUID", uuidHeader)
	}
	r.Value = msg.Payload
	r.Headers = make([]kgo.RecordHeader, 0, 1+len(msg.Metadata))
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: uuidHeader, Value: []byte(msg.UUID)})
	for k, v := range msg.Metadata {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	return r, nil
}

func (watermillFormat) Unmarshal(rec *kgo.Record) (*message.Message, error) {
	var id string
	md := make(message.Metadata, len(rec.Headers))
	for _, h := range rec.Headers {
		if h.Key == uuidHeader {
			id = string(h.Value)
		} else {
			md.Set(h.Key, string(h.Value))
		}
	}
	msg := message.NewMessage(id, rec.Value)
	msg.Metadata = md
	return msg, nil
}
