package console

import (
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
				if !c.cfg.ReadOnly {
					d.Matching = dry.Count
				}
			}
		}
		if err != nil {
			c.log.Error("console: poison topic", "err", err, "topic", d.Topic)
			d.Error, status = "Could not read the topic from Kafka: "+err.Error(), http.StatusBadGateway
		}
	}
	c.render(w, r, status, "poison", "Poison topic", "poison", d)
}

// poisonRequeue publishes poisoned messages (form id, or all=1) back to
// the topic each came from.
func (c *Console) poisonRequeue(w http.ResponseWriter, r *http.Request) (string, bool) {
	topic := r.PostForm.Get("topic")
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
	operator := c.cfg.Operator(r)
	if err != nil {
		c.log.Error("console: poison requeue failed", "operator", operator, "topic", topic, "ids", ids, "requeued", n, "err", err)
		c.fail(w, r, http.StatusBadGateway, "Requeue failed after "+strconv.Itoa(n)+" message(s): "+err.Error())
		return "", false
	}
	c.log.Info("console: poison requeue", "operator", operator, "topic", topic, "ids", ids, "requeued", n)
	return "/poison?topic=" + url.QueryEscape(topic) + "&kind=poison&done=requeue&n=" + strconv.Itoa(n), true
}
