package console

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/millrace/millrace/saga"
)

// The saga page's picture: the saga's steps, one column per step or
// parallel group, left to right in definition order, each box coloured by
// its state (the classes in static/console.css), drawn as inline SVG by
// the server.

const (
	boxW, boxH   = 168, 58
	colGap       = 34
	rowGap       = 12
	pictureInset = 8
)

type pictureBox struct {
	Name, Group, State string
	X, Y, W, H         int
	Attempts           string // "attempt 2", "attempt 1 · comp 1"
	Took               string // time taken, "-" when not started
	Current            bool
	// Child is the child saga the step's latest attempt started
	// (saga.Step.Child), "" for any other step: the box links to it.
	Child string
}

type pictureLink struct{ X1, Y1, X2, Y2 int }

type sagaPicture struct {
	W, H  int
	Boxes []pictureBox
	Links []pictureLink
	// FromDefinition: the columns are the registered definition's; else
	// the console has no definition for the saga's type and version, and
	// draws the steps that have started, one column each, in the order
	// they started.
	FromDefinition bool
}

// buildPicture lays out in's steps. names is the steps table's order (by
// start time), used when the orchestrator has no definition.
func buildPicture(o *saga.Orchestrator, in *saga.Instance, names []string, hist []saga.HistoryEntry, now time.Time) *sagaPicture {
	p := &sagaPicture{}
	var cols [][]string
	if steps, ok := o.DefinitionSteps(in.Type, in.Version); ok {
		p.FromDefinition = true
		for i, s := range steps {
			if i > 0 && s.Group != "" && s.Group == steps[i-1].Group {
				cols[len(cols)-1] = append(cols[len(cols)-1], s.Name)
				continue
			}
			cols = append(cols, []string{s.Name})
		}
	} else {
		// Without the definition the groups are unknown (steps run in one
		// transaction share a start time whether grouped or not): one
		// column per step.
		for _, name := range names {
			cols = append(cols, []string{name})
		}
	}
	if len(cols) == 0 {
		return nil
	}
	// The last history line of each step: when its latest operation ended;
	// and the child saga a child step started last.
	lastAt, child := map[string]time.Time{}, map[string]string{}
	for _, h := range hist {
		if h.Step != "" {
			lastAt[h.Step] = h.At
		}
		var d struct{ Child string }
		if h.Event == "child" && json.Unmarshal(h.Detail, &d) == nil {
			child[h.Step] = d.Child
		}
	}
	group := map[string]string{}
	if steps, ok := o.DefinitionSteps(in.Type, in.Version); ok {
		for _, s := range steps {
			group[s.Name] = s.Group
		}
	}
	rows := 0
	for _, c := range cols {
		rows = max(rows, len(c))
	}
	p.H = 2*pictureInset + rows*boxH + (rows-1)*rowGap
	p.W = 2*pictureInset + len(cols)*boxW + (len(cols)-1)*colGap
	mid := p.H / 2
	var prev []pictureBox
	for ci, c := range cols {
		x := pictureInset + ci*(boxW+colGap)
		top := mid - (len(c)*boxH+(len(c)-1)*rowGap)/2
		for ri, name := range c {
			st := in.Steps[name]
			if st == nil {
				st = &saga.StepState{}
			}
			b := pictureBox{Name: name, Group: group[name], State: st.Status,
				X: x, Y: top + ri*(boxH+rowGap), W: boxW, H: boxH,
				Current: name == in.Step, Took: "-", Child: child[name]}
			if b.State == saga.StepPending {
				b.State = "pending"
			}
			b.Attempts = fmt.Sprintf("attempt %d", st.Attempt)
			if st.CompensationAttempt > 0 {
				b.Attempts += fmt.Sprintf(" · comp %d", st.CompensationAttempt)
			}
			if st.StartedAt != nil {
				end, ok := lastAt[name]
				switch st.Status {
				case saga.StepRunning, saga.StepBackoff, saga.StepCompensating:
					end, ok = now, true // still going
				}
				if ok {
					// History times are stored to the microsecond, a
					// step's start to the nanosecond: a step that took no
					// time may end "before" it started.
					b.Took = took(max(0, end.Sub(*st.StartedAt)))
				}
			}
			p.Boxes = append(p.Boxes, b)
		}
		// A line from each box of the previous column to each of this one.
		here := p.Boxes[len(p.Boxes)-len(c):]
		for _, a := range prev {
			for _, b := range here {
				p.Links = append(p.Links, pictureLink{X1: a.X + a.W, Y1: a.Y + a.H/2, X2: b.X, Y2: b.Y + b.H/2})
			}
		}
		prev = here
	}
	return p
}

// took prints a step's time taken, to the millisecond under a second.
func took(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return human(d)
}

// The overview's charts: sagas started, completed, compensated and stuck
// per minute over the last hour, from saga_history's outcome lines.

const (
	chartMinutes     = 60
	chartBarW        = 4
	chartH           = 36
	chartGaugeW      = 240
	chartGaugeMaxAge = time.Hour
)

var chartSeries = []string{"started", "completed", "compensated", "stuck"}

type chartBar struct {
	Minute    int // minutes ago, 59 (oldest) to 0 (this minute)
	N         int64
	X, Y, H   int
	StartedAt string // the minute, for the bar's tooltip
}

type sagaChart struct {
	Series string
	Total  int64
	Max    int64
	W, H   int
	Bars   []chartBar
}

// sagaCharts buckets counts (per series, per minute index 0..59 from the
// oldest) into charts.
func sagaCharts(counts map[string][]int64, since time.Time) []sagaChart {
	out := make([]sagaChart, 0, len(chartSeries))
	for _, s := range chartSeries {
		c := sagaChart{Series: s, W: chartMinutes * chartBarW, H: chartH}
		ns := counts[s]
		for _, n := range ns {
			c.Total += n
			c.Max = max(c.Max, n)
		}
		for i, n := range ns {
			h := 0
			if c.Max > 0 && n > 0 {
				h = max(1, int(n*int64(chartH-2)/c.Max))
			}
			c.Bars = append(c.Bars, chartBar{Minute: chartMinutes - 1 - i, N: n,
				X: i * chartBarW, Y: chartH - h, H: h,
				StartedAt: since.Add(time.Duration(i) * time.Minute).UTC().Format("15:04Z")})
		}
		out = append(out, c)
	}
	return out
}

type ageGauge struct {
	Age   time.Duration
	W, Of int // filled width of Of
}

// backlogGauge scales the oldest pending event's age on a bar that is full
// at an hour. There is no table of past backlog ages, so this is the
// current value only.
func backlogGauge(age time.Duration) ageGauge {
	g := ageGauge{Age: age, Of: chartGaugeW}
	if age > 0 {
		g.W = max(1, int(min(age, chartGaugeMaxAge)*time.Duration(chartGaugeW)/chartGaugeMaxAge))
	}
	return g
}
