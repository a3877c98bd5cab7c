package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/millrace/millrace/core"
)

// Lanes is the number of lanes the partition keys are hashed into. A relay
// works on a set of lanes at a time and a lane is worked on by one relay at
// a time, which is what keeps each key's events in order with many relays.
// It is fixed by the schema (outbox_lane has one row per lane).
const Lanes = 128

// MaxKeyBytes is the longest Topic and PartitionKey, in bytes. Both go into
// indexes (the topic into the event's identity, the key into the index that
// holds a failed event's key back), and PostgreSQL cannot index a value
// over about 2.7 kB: a longer one would fail when written, or worse, when
// the relay returns the failed event to the pending set.
const MaxKeyBytes = 1024

// lane returns the lane of a partition key: FNV-1a of the key modulo Lanes.
func lane(partitionKey string) int16 {
	h := fnv.New32a()
	h.Write([]byte(partitionKey))
	return int16(h.Sum32() % Lanes)
}

// Event is one event to write to the outbox.
//
// The text fields (Topic, PartitionKey, AggregateType, AggregateID,
// EventType, and Metadata's keys and values) must be valid UTF-8 without
// NUL bytes: PostgreSQL's text cannot hold NUL, and Kafka headers and most
// other transports carry text. WriteTx refuses anything else with an
// *EventError before it sends anything.
type Event struct {
	// ID is the event id, a UUID that travels with the event (as the
	// Watermill message UUID and metadata event_id) and that consumers
	// deduplicate on. Defaults to a new time-ordered UUID (v7).
	//
	// An event is identified by its ID and Topic together: the same ID may
	// go to several topics (Watermill's msg.Copy() keeps the UUID, and
	// publishing a copy to a second topic is a fan-out), each a separate
	// event; the same ID twice on one topic is refused (ErrDuplicateEvent).
	ID string
	// Topic is where the relay publishes the event. Required, at most
	// MaxKeyBytes; with WriterConfig.ValidateTopic it must also suit the
	// transport.
	Topic string
	// PartitionKey orders events: those with the same topic and key are
	// published in commit order (order is per topic and key; events of one
	// key written to two topics are published grouped by topic, as Kafka
	// orders per topic partition only), and the Kafka publisher uses it as
	// the record key. Required, at most MaxKeyBytes.
	PartitionKey string
	// AggregateType, AggregateID and EventType describe the event for
	// consumers, replay and operators. Optional.
	AggregateType string
	AggregateID   string
	EventType     string
	// Payload is the event body, delivered byte for byte as written. It
	// must be valid JSON in UTF-8 (stored as json, which keeps the text
	// exactly) unless Binary is set.
	Payload []byte
	// Binary marks Payload as opaque bytes (stored as bytea).
	Binary bool
	// Metadata travels with the event as Watermill metadata (Kafka headers),
	// for example trace context. The relay adds millrace's keys (event_id,
	// partition_key, content_type and, when set, event_type, aggregate_type,
	// aggregate_id); a Metadata entry under one of those keys must agree
	// with the event, or the event is refused (ErrInvalidEvent), so that
	// what a consumer reads is what was written.
	Metadata map[string]string
}

// Errors for events that cannot be written.
var (
	// ErrInvalidEvent is wrapped, in an *EventError that says which event
	// of a call was at fault, by the errors of an event WriteTx refuses:
	// no topic, an empty partition key, a payload that is not JSON, text
	// with NUL or invalid UTF-8, a topic or key over MaxKeyBytes, metadata
	// that cannot travel unchanged, a topic WriterConfig.ValidateTopic
	// refuses (that error is wrapped too), an id that is not a UUID (with
	// core.ErrInvalidEventID). The message names the field.
	ErrInvalidEvent = errors.New("outbox: invalid event")
	// ErrDuplicateEvent: the event id was given twice for one topic, in
	// one call (reported before anything is sent) or in an earlier write
	// (reported by the database: the transaction is then aborted).
	ErrDuplicateEvent = errors.New("outbox: event id already used on this topic")
)

// errNoEvents is the error of a write of no events.
var errNoEvents = fmt.Errorf("%w: no events to write", ErrInvalidEvent)

// EventError is a problem with one event of a Write call. Nothing of the
// call was written.
type EventError struct {
	Index int    // position of the event in the call
	ID    string // its id, as given
	Err   error  // wraps one of the Err... values
}

func (e *EventError) Error() string {
	return fmt.Sprintf("outbox: event %d (id %q): %v", e.Index, e.ID, e.Err)
}

func (e *EventError) Unwrap() error { return e.Err }

// validText reports whether s can be stored as PostgreSQL text and travel
// as a header unchanged: valid UTF-8 without NUL.
func validText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// normalize checks e and fills its defaults. It returns the parsed id.
// validateTopic, if not nil, checks the topic against the transport's rules.
func (e *Event) normalize(index int, validateTopic func(string) error) (uuid.UUID, error) {
	fail := func(err error) (uuid.UUID, error) { return uuid.UUID{}, &EventError{Index: index, ID: e.ID, Err: err} }
	if e.Topic == "" {
		return fail(fmt.Errorf("%w: no topic", ErrInvalidEvent))
	}
	if e.PartitionKey == "" {
		return fail(fmt.Errorf("%w: empty partition key", ErrInvalidEvent))
	}
	for _, f := range [...]struct{ name, value string }{
		{"Topic", e.Topic}, {"PartitionKey", e.PartitionKey}, {"AggregateType", e.AggregateType},
		{"AggregateID", e.AggregateID}, {"EventType", e.EventType},
	} {
		if !validText(f.value) {
			return fail(fmt.Errorf("%w: %s %q holds NUL or invalid UTF-8", ErrInvalidEvent, f.name, f.value))
		}
	}
	if len(e.Topic) > MaxKeyBytes || len(e.PartitionKey) > MaxKeyBytes {
		return fail(fmt.Errorf("%w: topic or partition key too long: topic %d bytes, partition key %d bytes, at most %d each", ErrInvalidEvent, len(e.Topic), len(e.PartitionKey), MaxKeyBytes))
	}
	if validateTopic != nil {
		if err := validateTopic(e.Topic); err != nil {
			return fail(fmt.Errorf("%w: topic %q: %w", ErrInvalidEvent, e.Topic, err))
		}
	}
	var id uuid.UUID
	var err error
	if e.ID == "" {
		id, err = uuid.NewV7()
		if err != nil {
			return fail(err)
		}
	} else if id, err = uuid.Parse(e.ID); err != nil {
		return fail(fmt.Errorf("%w: %w: %v", ErrInvalidEvent, core.ErrInvalidEventID, err))
	}
	given := e.ID
	e.ID = id.String()
	if !e.Binary && (!utf8.Valid(e.Payload) || !json.Valid(e.Payload)) {
		return fail(fmt.Errorf("%w: payload is not valid JSON in UTF-8 (set Binary for opaque payloads)", ErrInvalidEvent))
	}
	if err := e.checkMetadata(); err != nil {
		e.ID = given
		return fail(err)
	}
	return id, nil
}

// checkMetadata refuses metadata that would not reach a consumer as
// written: text PostgreSQL or a transport cannot carry, and millrace keys
// that the relay would overwrite with another value.
func (e *Event) checkMetadata() error {
	for k, v := range e.Metadata {
		if k == "" || !validText(k) {
			return fmt.Errorf("%w: metadata key %q is empty or holds NUL or invalid UTF-8", ErrInvalidEvent, k)
		}
		if !validText(v) {
			return fmt.Errorf("%w: metadata value of %q holds NUL or invalid UTF-8", ErrInvalidEvent, k)
		}
	}
	if len(e.Metadata) == 0 {
		return nil
	}
	contentType := core.ContentTypeJSON
	if e.Binary {
		contentType = core.ContentTypeBinary
	}
	for _, r := range [...]struct {
		key, value string
		always     bool // the relay sets it even when value is empty
	}{
		{core.MetadataEventID, e.ID, true},
		{core.MetadataPartitionKey, e.PartitionKey, true},
		{core.MetadataEventType, e.EventType, false},
		{core.MetadataAggregateType, e.AggregateType, false},
		{core.MetadataAggregateID, e.AggregateID, false},
	} {
		v, ok := e.Metadata[r.key]
		if ok && v != r.value && (r.always || r.value != "") {
			return fmt.Errorf("%w: metadata %s is %q, the event's is %q", ErrInvalidEvent, r.key, v, r.value)
		}
	}
	// A content type of the user's own (text/plain, a schema-registry
	// type) travels as given; only the two millrace types must match how
	// the payload is stored.
	if v, ok := e.Metadata[core.MetadataContentType]; ok && v != contentType &&
		(v == core.ContentTypeJSON || v == core.ContentTypeBinary) {
		return fmt.Errorf("%w: metadata %s is %q, but the payload is stored as %s", ErrInvalidEvent, core.MetadataContentType, v, contentType)
	}
	return nil
}
