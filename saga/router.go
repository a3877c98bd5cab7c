package saga

import (
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	poisonlog "github.com/millrace/millrace/internal/poison"
)

// RouterConfig says how AddToRouter wires the orchestrator into a Router.
type RouterConfig struct {
	// Subscriber reads the reply topics. Required.
	Subscriber message.Subscriber
	// Poison receives the messages that fail permanently (not a saga
	// reply: ErrBadReply), with the reason in metadata "reason_poisoned";
	// each is logged at error level with the reason (Config.Logger) and
	// counted (Metrics, poisoned_total). Other failures are nacked for
	// redelivery. Required: nothing is lost.
	Poison message.Publisher
	// PoisonTopic is the topic of Poison. Defaults to the reply topic +
	// ".poison".
	PoisonTopic string
	// Retry retries failed handler runs in process, each in a fresh
	// transaction. Defaults to 5 retries from 100ms, doubling up to 5s,
	// skipping permanent errors (inbox.ShouldRetry).
	Retry *middleware.Retry
}

// AddToRouter adds one handler per reply topic of the registered
// definitions (ReplyTopics) to r, behind PoisonQueue (permanent failures
// only) and Retry, in that order, around Handler (the inbox dedup, the row
// lock, the state change and the next command in one transaction). Register
// the definitions first.
func (o *Orchestrator) AddToRouter(r *message.Router, cfg RouterConfig) ([]*message.Handler, error) {
	switch {
	case r == nil:
		return nil, fmt.Errorf("%w: saga: nil router", core.ErrConfig)
	case cfg.Subscriber == nil:
		return nil, fmt.Errorf("%w: saga: RouterConfig.Subscriber is required", core.ErrConfig)
	case cfg.Poison == nil:
		return nil, fmt.Errorf("%w: saga: RouterConfig.Poison is required", core.ErrConfig)
	}
	topics := o.ReplyTopics()
	if len(topics) == 0 {
		return nil, fmt.Errorf("%w: saga: AddToRouter: no definitions registered", core.ErrConfig)
	}
	retry := middleware.Retry{MaxRetries: 5, InitialInterval: 100 * time.Millisecond, MaxInterval: 5 * time.Second,
		Multiplier: 2, ShouldRetry: inbox.ShouldRetry}
	if cfg.Retry != nil {
		retry = *cfg.Retry
	}
	poisonPub := o.poisonPublisher(cfg.Poison)
	var hs []*message.Handler
	for _, topic := range topics {
		poisonTopic := cfg.PoisonTopic
		if poisonTopic == "" {
			poisonTopic = topic + ".poison"
		}
		poison, err := middleware.PoisonQueueWithFilter(poisonPub, poisonTopic, core.IsPermanent)
		if err != nil {
			return nil, fmt.Errorf("%w: saga: %v", core.ErrConfig, err)
		}
		h := r.AddConsumerHandler("saga."+o.consumer+"."+topic, topic, cfg.Subscriber, o.Handler())
		h.AddMiddleware(poison, retry.Middleware)
		hs = append(hs, h)
	}
	return hs, nil
}

// poisonPublisher wraps pub so that each poisoned reply is logged at error
// level with its reason (to Config.Logger, or slog.Default() when that
// discards everything) and counted by reply topic (metadata
// "topic_poisoned"), once its publish succeeded. AddToRouter and RunBatched
// both poison through it.
func (o *Orchestrator) poisonPublisher(pub message.Publisher) message.Publisher {
	logger := o.logger
	if _, nop := logger.(watermill.NopLogger); nop {
		logger = nil
	}
	return poisonlog.Publisher(pub, logger, func(msg *message.Message) {
		o.metrics.poisoned(msg.Metadata.Get(middleware.PoisonedTopicKey))
	})
}
