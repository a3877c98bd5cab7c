package console

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	"github.com/millrace/millrace/internal/poisontopic"
	"github.com/millrace/millrace/kafka"
)

type poisonData struct {
	Brokers  bool     // Config.KafkaBrokers is set
	Topics   []string // Config.PoisonTopics
	Topic    string
	Total    int
	Messages []poisontopic.Message
	Error    string
	// Filter narrows the list (reason, original topic, age; deadbulk.go);
	// Matching is how many messages it selects, for "requeue all N
	// matching", -1 when it offers none.
	Filter   deadFilter
	Matching int
	// CanRequeue: this identity may requeue; Payloads are what it is
	// shown of each message's payload, by UUID.
	CanRequeue bool
	Payloads   map[string]shown
}

// poisonPage shows a poison topic read from Kafka: how many messages it
// holds and the newest ones, each with the reason it was poisoned.
func (c *Console) poisonPage(w http.ResponseWriter, r *http.Request) {
	f, ok := c.readFilter(w, r, "poison", r.URL.Query().Get)
	if !ok {
		return
	}
	d := poisonData{Brokers: len(c.cfg.KafkaBrokers) > 0, Topics: c.cfg.PoisonTopics, Topic: f.Topic, Matching: -1}
	if d.Topic == "" && len(d.Topics) == 1 {
		d.Topic = d.Topics[0]
	}
	f.Topic = d.Topic
	d.Filter = f
	if !c.allow(w, r, "read", f.resource()) {
		return
	}
	d.CanRequeue = c.can(r, "requeue", f.resource())
	status := http.StatusOK
	if d.Brokers && d.Topic != "" {
		if err := kafka.ValidateTopic(d.Topic); err != nil {
			c.fail(w, r, http.StatusBadRequest, "Not a Kafka topic name: "+err.Error())
			return
		}
		ctx, cancel := reqCtx(r)
		defer cancel()
		var err error
		if d.Total, d.Messages, err = poisontopic.Read(ctx, c.cfg.KafkaBrokers, d.Topic, c.cfg.PageSize); err == nil && f.selected() {
			var dry *poisontopic.DryRun
			if dry, err = poisontopic.DryRunMatching(ctx, c.cfg.KafkaBrokers, d.Topic, f.poisonQuery(), c.cfg.PageSize); err == nil {
				d.Messages = dry.First
				if d.CanRequeue {
					d.Matching = dry.Count
				}
			}
		}
		if err != nil {
			c.log.Error("console: poison topic", "err", err, "topic", d.Topic)
			d.Error, status = "Could not read the topic from Kafka: "+err.Error(), http.StatusBadGateway
		}
	}
	d.Payloads = map[string]shown{}
	for _, m := range d.Messages {
		d.Payloads[m.UUID] = c.show(r, Resource{Kind: "poison", Type: d.Topic, ID: m.UUID}, []byte(m.Payload))
	}
	c.render(w, r, status, "poison", "Poison topic", "poison", d)
}

// poisonRequeue publishes poisoned messages (form id, or all=1) back to
// the topic each came from, and records it in the audit trail.
func (c *Console) poisonRequeue(w http.ResponseWriter, r *http.Request) (string, bool) {
	topic := r.PostForm.Get("topic")
	if !c.allow(w, r, "requeue", Resource{Kind: "poison", Type: topic}) {
		return "", false
	}
	reason, ok := c.reason(w, r)
	if !ok {
		return "", false
	}
	if len(c.cfg.KafkaBrokers) == 0 {
		c.fail(w, r, http.StatusBadRequest, "The console has no Kafka brokers configured: nothing was requeued.")
		return "", false
	}
	if err := kafka.ValidateTopic(topic); err != nil {
		c.fail(w, r, http.StatusBadRequest, "Not a Kafka topic name: "+err.Error())
		return "", false
	}
	var ids []string
	if r.PostForm.Get("all") != "1" {
		ids = slices.DeleteFunc(r.PostForm["id"], func(s string) bool { return s == "" })
		if len(ids) == 0 {
			c.fail(w, r, http.StatusBadRequest, "Say which messages to requeue: nothing was requeued.")
			return "", false
		}
	}
	ctx, cancel := reqCtx(r)
	defer cancel()
	n, err := poisontopic.Requeue(ctx, c.cfg.KafkaBrokers, topic, ids)
	by := actor(r, reason)
	operator := by.Operator
	detail := map[string]any{"ids": ids, "all": ids == nil, "requeued": n}
	if aerr := c.auditPoison(context.WithoutCancel(ctx), by, topic, detail, n, err); aerr != nil {
		err = errors.Join(err, aerr)
	}
	if err != nil {
		c.log.Error("console: poison requeue failed", "operator", operator, "topic", topic, "ids", ids, "requeued", n, "err", err)
		c.fail(w, r, http.StatusBadGateway, "Requeue failed after "+strconv.Itoa(n)+" message(s): "+err.Error())
		return "", false
	}
	c.log.Info("console: poison requeue", "operator", operator, "topic", topic, "ids", ids, "requeued", n)
	return "/poison?topic=" + url.QueryEscape(topic) + "&kind=poison&done=requeue&n=" + strconv.Itoa(n), true
}
