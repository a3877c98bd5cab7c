// Package core holds the small vocabulary that millrace's packages share,
// and that a service's own code reads and writes:
//
//   - the metadata keys every outbox event carries on the wire
//     (MetadataEventID, MetadataPartitionKey, ...);
//   - the saga wire protocol: the headers of the commands and replies
//     between the orchestrator and its participants (MetadataSagaID, ...,
//     OperationAction, OutcomeSuccess, ...);
//   - the errors: the one config error sentinel (ErrConfig), Permanent and
//     IsPermanent for a failure that retrying will not fix, and BatchError
//     for a publisher that says which messages of a batch failed;
//   - the transaction a handler runs in (ContextWithTx, TxFromContext);
//   - the dead-letter listing parameters (ListParams, DeadLetterQuery);
//   - the batch interface of a subscriber (BatchSubscriber, Batch), which
//     kafka.Subscriber has and the batched consumers look for.
//
// It imports no other millrace package: every other package imports it.
// The service that runs everything is in the root package, millrace.
package core
