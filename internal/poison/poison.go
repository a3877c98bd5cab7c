// Package poison wraps a poison publisher (where a Router's PoisonQueue
// writes the messages that fail for good) so that every poisoned message is
// logged and counted. It is free of any Kafka client: saga and compensation
// use it. The poison topic's reader is package poisontopic.
package poison

import (
	"errors"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
)

// Publisher wraps a poison publisher: each message published through it
// is logged at error level with its reason and counted by count (may be
// nil), once its publish succeeded. A nil logger logs to slog.Default().
func Publisher(pub message.Publisher, logger watermill.LoggerAdapter, count func(msg *message.Message)) message.Publisher {
	if logger == nil {
		logger = watermill.NewSlogLogger(slog.Default())
	}
	return &publisher{Publisher: pub, log: logger, count: count}
}

type publisher struct {
	message.Publisher
	log   watermill.LoggerAdapter
	count func(msg *message.Message)
}

func (p *publisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	for _, m := range msgs {
		reason := m.Metadata.Get(middleware.ReasonForPoisonedKey)
		p.log.Error("Message poisoned", errors.New(reason), watermill.LogFields{"event_id": m.UUID, "poison_topic": topic,
			"topic": m.Metadata.Get(middleware.PoisonedTopicKey), "handler": m.Metadata.Get(middleware.PoisonedHandlerKey),
			"reason": reason})
		if p.count != nil {
			p.count(m)
		}
	}
	return nil
}
