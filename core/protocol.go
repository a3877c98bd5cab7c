package core

// The saga wire protocol: the metadata a saga's commands and replies carry,
// shared by the saga orchestrator (package saga) and its participants
// (package compensation). A participant in another language takes part by
// reading and writing these headers: on Kafka they are record headers (with
// the outbox metadata keys above), on other transports Watermill metadata.
//
// A command is a message on a participant's command topic with
// MetadataSagaID, MetadataSagaType, MetadataSagaStep, MetadataSagaAttempt,
// MetadataSagaOperation, MetadataSagaCommand and MetadataSagaReplyTopic set;
// its payload is the command's JSON. Every attempt of a command is a new
// message (a new event id) with a higher attempt number; the participant's
// barrier, keyed by (saga id, step, operation), makes a repeated attempt
// re-send its first reply instead of running again.
//
// A reply is a message on the command's MetadataSagaReplyTopic with the
// command's MetadataSagaID, MetadataSagaType, MetadataSagaStep,
// MetadataSagaAttempt and MetadataSagaOperation copied back, and
// MetadataSagaOutcome set (MetadataSagaReason too for a failure); its payload
// is the reply data as JSON ("{}" when there is none).
//
// Commands and replies are keyed (MetadataPartitionKey) by saga id, so one
// saga's messages keep their order.
//
// Every command and reply carries MetadataSagaProtocol, the protocol
// version its sender speaks (SagaProtocolVersion); a message without it is
// version 1. A participant answers a command of a version it does not know
// with a failure reply whose reason says so (OutcomeFailure), without
// running anything or writing its barrier; an orchestrator refuses a reply
// of a version it does not know as malformed (it is poisoned, and the step
// runs into its timeout). docs/protocol.md is the specification, with
// test vectors under testdata/protocol.
const (
	// MetadataSagaProtocol is the saga protocol version of a command or
	// reply, in decimal: SagaProtocolVersion. Absent means version 1.
	MetadataSagaProtocol = "saga_protocol"
	// MetadataSagaID is the saga instance id, chosen by the caller or
	// generated: non-empty, at most 200 bytes of valid UTF-8 without NUL.
	MetadataSagaID = "saga_id"
	// MetadataSagaType is the saga type's name.
	MetadataSagaType = "saga_type"
	// MetadataSagaStep is the step's name (never its position).
	MetadataSagaStep = "saga_step"
	// MetadataSagaAttempt is the attempt number of the command, in decimal,
	// starting at 1.
	MetadataSagaAttempt = "saga_attempt"
	// MetadataSagaOperation is OperationAction or OperationCompensation.
	MetadataSagaOperation = "saga_operation"
	// MetadataSagaCommand is the command's name, which a participant routes
	// on (several commands may share a topic).
	MetadataSagaCommand = "saga_command"
	// MetadataSagaReplyTopic is the topic the participant replies to.
	MetadataSagaReplyTopic = "saga_reply_topic"
	// MetadataSagaOutcome is set on replies: OutcomeSuccess, OutcomeFailure
	// or OutcomeCancelled.
	MetadataSagaOutcome = "saga_outcome"
	// MetadataSagaReason is the reason of a failure or cancelled reply.
	MetadataSagaReason = "saga_reason"
)

// SagaProtocolVersion is the saga protocol version this module speaks,
// the value of MetadataSagaProtocol on the commands and replies it sends.
// A command or reply without the header (from before it existed) is of
// version 1; one of any other version is refused.
const SagaProtocolVersion = "1"

// Operations of a saga command.
const (
	// OperationAction runs a step's action.
	OperationAction = "action"
	// OperationCompensation undoes a step's action (semantically).
	OperationCompensation = "compensation"
)

// Outcomes of a saga reply.
const (
	// OutcomeSuccess: the operation took effect; the payload is its reply data.
	OutcomeSuccess = "success"
	// OutcomeFailure: a business failure ("insufficient credit"); nothing
	// took effect. MetadataSagaReason says why.
	OutcomeFailure = "failure"
	// OutcomeCancelled: a late action, which arrived after its compensation
	// and did not run.
	OutcomeCancelled = "cancelled"
)
