package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/google/uuid"
)

// Lanes is the number of lanes the partition keys are hashed into. A relay
// works on a set of lanes at a time and a lane is worked on by one relay at
// a time, which is what keeps each key's events in order with many relays.
// It is fixed by the schema (outbox_lane has one row per lane).
const Lanes = 128

// Lane returns the lane of a partition key: FNV-1a of the key modulo Lanes.
func Lane(partitionKey string) int16 {
	h := fnv.New32a()
	h.Write([]byte(partitionKey))
	return int16(h.Sum32() % Lanes)
}

// Event is one event to write to the outbox.
type Event struct {
	// ID is the event id, a UUID that travels with the event and that
	// consumers deduplicate on. Defaults to a new time-ordered UUID (v7).
	ID string
	// Topic is where the relay publishes the event. Required.
	Topic string
	// PartitionKey orders events: those with the same key are published in
	// commit order, and the Kafka publisher uses it as the record key.
	// Required.
	PartitionKey string
	// AggregateType, AggregateID and EventType describe the event for
	// consumers, replay and operators. Optional.
	AggregateType string
	AggregateID   string
	EventType     string
	// Payload is the event body. It must be valid JSON (stored as jsonb)
	// unless Binary is set.
	Payload []byte
	// Binary marks Payload as opaque bytes (stored as bytea).
	Binary bool
	// Metadata travels with the event as Watermill metadata (Kafka headers),
	// for example trace context.
	Metadata map[string]string
}

// Errors for events that cannot be written. They come wrapped in an
// *EventError that says which event of a call was at fault.
var (
	ErrMissingTopic      = errors.New("outbox: event has no topic")
	ErrEmptyPartitionKey = errors.New("outbox: event has an empty partition key")
	ErrInvalidEventID    = errors.New("outbox: event id is not a UUID")
	ErrInvalidJSON       = errors.New("outbox: payload is not valid JSON (set Binary for opaque payloads)")
	ErrNoEvents          = errors.New("outbox: no events to write")
)

// EventError is a problem with one event of a Write call. Nothing of the
// call was written.
type EventError struct {
	Index int    // position of the event in the call
	ID    string // its id, as given
	Err   error  // one of the Err... values
}

func (e *EventError) Error() string {
	return fmt.Sprintf("outbox: event %d (id %q): %v", e.Index, e.ID, e.Err)
}

func (e *EventError) Unwrap() error { return e.Err }

// normalize checks e and fills its defaults. It returns the parsed id.
func (e *Event) normalize(index int) (uuid.UUID, error) {
	fail := func(err error) (uuid.UUID, error) { return uuid.UUID{}, &EventError{Index: index, ID: e.ID, Err: err} }
	if e.Topic == "" {
		return fail(ErrMissingTopic)
	}
	if e.PartitionKey == "" {
		return fail(ErrEmptyPartitionKey)
	}
	var id uuid.UUID
	var err error
	if e.ID == "" {
		id, err = uuid.NewV7()
		if err != nil {
			return fail(err)
		}
	} else if id, err = uuid.Parse(e.ID); err != nil {
		return fail(fmt.Errorf("%w: %v", ErrInvalidEventID, err))
	}
	e.ID = id.String()
	if !e.Binary && !json.Valid(e.Payload) {
		return fail(ErrInvalidJSON)
	}
	return id, nil
}
