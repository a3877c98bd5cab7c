package console

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/millrace/millrace/internal/kafkalag"
	"github.com/millrace/millrace/saga"
)

type lagData struct {
	Brokers    bool // Config.KafkaBrokers is set
	StallAfter string
	All        bool // the partitions without lag are listed too
	Partitions int
	Groups     int
	Stalled    int
	Lags       []kafkalag.Partition
	Error      string
}

// lagPage shows each consumer group's lag per partition, read from Kafka:
// who holds the partition, the age of its oldest unconsumed record, and
// the partitions stalled (records wait longer than LagStallAfter and
// nobody takes them), first.
func (c *Console) lagPage(w http.ResponseWriter, r *http.Request) {
	if !c.allow(w, r, "read", Resource{Kind: "kafka"}) {
		return
	}
	d := lagData{Brokers: len(c.cfg.KafkaBrokers) > 0, StallAfter: c.cfg.LagStallAfter.String(), All: r.URL.Query().Get("all") == "1"}
	status := http.StatusOK
	if d.Brokers {
		lags, err := c.readLag(r, "", "")
		switch {
		case errors.Is(err, kafkalag.ErrNoGroups):
		case err != nil:
			c.log.Error("console: consumer lag", "err", err)
			d.Error, status = "Could not read the consumer groups from Kafka: "+err.Error(), http.StatusBadGateway
		}
		groups := map[string]bool{}
		var stalled, rest []kafkalag.Partition
		for _, l := range lags {
			groups[l.Group] = true
			switch {
			case l.Stalled:
				stalled = append(stalled, l)
			case d.All || l.Lag != 0 || l.Err != "":
				rest = append(rest, l)
			}
		}
		d.Partitions, d.Groups, d.Stalled = len(lags), len(groups), len(stalled)
		d.Lags = append(stalled, rest...)
	}
	c.render(w, r, status, "kafka_lag", "Consumer lag", "lag", d)
}

// readLag reads, with the console's settings, every consumer group's lag
// (key "") or the lag on the partition of topic that key is sent to.
func (c *Console) readLag(r *http.Request, topic, key string) ([]kafkalag.Partition, error) {
	lr, err := kafkalag.New(kafkalag.Config{Brokers: c.cfg.KafkaBrokers, StallAfter: c.cfg.LagStallAfter})
	if err != nil {
		return nil, err
	}
	defer lr.Close()
	ctx, cancel := reqCtx(r)
	defer cancel()
	if key == "" {
		return lr.Read(ctx)
	}
	return lr.ForKey(ctx, topic, key)
}

// stalledCommand is a saga's command that waits on a stalled partition.
type stalledCommand struct {
	Step, Topic string
	Lag         kafkalag.Partition
}

// stalledCommand returns where the saga's current step's command waits
// when that partition is stalled in a group that consumes its topic: the
// saga will time out there, and the cause is the consumer, not the saga.
// It reads Kafka only for a live saga whose current step waits for a
// reply, and says nothing when Kafka cannot be read (the lag page does).
func (c *Console) stalledCommand(r *http.Request, in *saga.Instance, hist []saga.HistoryEntry) *stalledCommand {
	if len(c.cfg.KafkaBrokers) == 0 || in.Status != saga.StatusRunning && in.Status != saga.StatusCompensating {
		return nil
	}
	st := in.Steps[in.Step]
	if st == nil || st.Status != saga.StepRunning && st.Status != saga.StepCompensating {
		return nil
	}
	topic := ""
	for _, h := range hist {
		var d struct{ Topic string }
		if h.Event == "command" && h.Step == in.Step && json.Unmarshal(h.Detail, &d) == nil && d.Topic != "" {
			topic = d.Topic // the last one
		}
	}
	if topic == "" {
		return nil
	}
	lags, err := c.readLag(r, topic, in.ID)
	if err != nil {
		c.log.Warn("console: lag of a saga's command", "saga", in.ID, "topic", topic, "err", err)
		return nil
	}
	for _, l := range lags {
		if l.Stalled {
			return &stalledCommand{Step: in.Step, Topic: topic, Lag: l}
		}
	}
	return nil
}
