// Package service runs everything a millrace service has with one value,
// the way river's Client does for a job queue: the outbox relay, the saga
// orchestrator's reply handlers and timers, the participants' command
// handlers, and the retention cleaners.
//
//	w, _ := outbox.NewWriter(pool, outbox.WriterConfig{})
//	orch, _ := saga.New(pool, saga.Config{Writer: w})
//	orch.Register(orders)
//	payments, _ := compensation.NewParticipant(pool, compensation.Config{Name: "payments", Writer: w})
//	compensation.Register(payments, "reserve_credit", reserve, release)
//
//	svc, err := service.New(pool, service.Config{
//		Name:         "orders", // the Kafka consumer group
//		Brokers:      brokers,
//		Writer:       w,
//		Orchestrator: orch,
//		Participants: []service.Participant{
//			{Participant: payments, Router: compensation.RouterConfig{Topic: "payment.commands"}},
//		},
//	})
//	if err != nil {
//		return err
//	}
//	return svc.Run(ctx) // until ctx ends (nil) or a part fails (its error)
//
// New builds every part from the Config and refuses a bad one (errors
// wrap core.ErrConfig): the relay on a kafka.Publisher, one Kafka
// subscriber in the service's consumer group, one Watermill Router with a
// handler per reply topic (saga.Orchestrator.AddToRouter, or
// RunBatched with Config.Batch) and per command topic
// (compensation.Participant.AddToRouter), the Orchestrator's timers
// (saga.Orchestrator.Run) and the cleaners of the outbox, the inbox and the
// barrier. Each part is the package's own; Service only starts and stops
// them.
//
// Run starts them all and, when ctx ends, stops them in order: the
// consumers first (the Router finishes the messages in hand), then the
// timers and the cleaners, then the relay, so nothing is cut off halfway;
// then it returns nil. When a part fails (it cannot start, as the relay
// without its tables, or it stops on its own) Run stops the others the
// same way and returns that part's error, prefixed with the service's and
// the part's names. Errors the parts retry (the broker or the database
// away for a while) are logged, by default to slog.Default().
//
// Messages that can never be handled (a reply that is not one, an unknown
// command, a payload that does not decode) are poisoned: by default they
// go through the service's own outbox (PoisonPublisher) to the message's
// topic + ".poison", so a service needs no second publisher for them and
// a poisoned message is in PostgreSQL before it is acknowledged.
//
// Service lives in a package of its own because it imports every other
// package of millrace (outbox, inbox, saga, compensation, kafka), and the
// root package millrace is imported by all of them.
package service
