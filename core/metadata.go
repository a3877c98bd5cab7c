package core

// Metadata keys that the outbox relay sets on every message it publishes.
// Kafka carries them as record headers (watermill-kafka's marshaling), other
// Watermill publishers as message metadata. The inbox reads MetadataEventID
// to deduplicate.
const (
	// MetadataEventID is the outbox event id, a UUID. It equals the
	// Watermill message UUID of the published message.
	MetadataEventID = "event_id"
	// MetadataEventType is the event type given when the event was written.
	MetadataEventType = "event_type"
	// MetadataAggregateType is the aggregate type given when the event was written.
	MetadataAggregateType = "aggregate_type"
	// MetadataAggregateID is the aggregate id given when the event was written.
	MetadataAggregateID = "aggregate_id"
	// MetadataPartitionKey is the partition key; the Kafka publisher uses it
	// as the record key.
	MetadataPartitionKey = "partition_key"
	// MetadataContentType is "application/json" for JSON payloads and
	// "application/octet-stream" for binary ones.
	MetadataContentType = "content_type"
)

// MetadataPoisonedID is the metadata key under which a message a service
// poisoned keeps its own id (Watermill's message UUID): the poisoned copy
// goes through the service's outbox under an event id of its own, derived
// from its topic and that id.
const MetadataPoisonedID = "poisoned_message_id"

// Content types of outbox payloads.
const (
	ContentTypeJSON   = "application/json"
	ContentTypeBinary = "application/octet-stream"
)
