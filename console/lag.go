package console

import (
	"errors"
	"net/http"

	"github.com/millrace/millrace/kafka"
)

type lagData struct {
	Brokers    bool // Config.KafkaBrokers is set
	StallAfter string
	All        bool // the partitions without lag are listed too
	Partitions int
	Groups     int
	Stalled    int
	Lags       []kafka.PartitionLag
	Error      string
}

// lagPage shows each consumer group's lag per partition, read from Kafka:
// who holds the partition, the age of its oldest unconsumed record, and
// the partitions stalled (records wait longer than LagStallAfter and
// nobody takes them), first.
func (c *Console) lagPage(w http.ResponseWriter, r *http.Request) {
	d := lagData{Brokers: len(c.cfg.KafkaBrokers) > 0, StallAfter: c.cfg.LagStallAfter.String(), All: r.URL.Query().Get("all") == "1"}
	status := http.StatusOK
	if d.Brokers {
		lags, err := c.readLag(r)
		switch {
		case errors.Is(err, kafka.ErrNoGroups):
		case err != nil:
			c.log.Error("console: consumer lag", "err", err)
			d.Error, status = "Could not read the consumer groups from Kafka: "+err.Error(), http.StatusBadGateway
		}
		groups := map[string]bool{}
		var stalled, rest []kafka.PartitionLag
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

// readLag reads every consumer group's lag with the console's settings.
func (c *Console) readLag(r *http.Request) ([]kafka.PartitionLag, error) {
	lr, err := kafka.NewLagReader(kafka.LagConfig{Brokers: c.cfg.KafkaBrokers, StallAfter: c.cfg.LagStallAfter})
	if err != nil {
		return nil, err
	}
	defer lr.Close()
	ctx, cancel := reqCtx(r)
	defer cancel()
	return lr.Read(ctx)
}
