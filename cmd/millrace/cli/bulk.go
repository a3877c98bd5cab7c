package cli

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

// bulkFlags are a saga action's selection flags: without a saga id, the
// action applies to every saga they select (saga.Orchestrator.Bulk).
type bulkFlags struct {
	typ, status, step, errMatch, by string
	attrs                           []string
	older, idle                     time.Duration
	limit                           int
	dryRun                          bool
}

func addBulkFlags(cmd *cobra.Command) *bulkFlags {
	b := &bulkFlags{}
	f := cmd.Flags()
	f.StringVar(&b.typ, "type", "", "bulk: sagas of this type")
	f.StringVar(&b.status, "status", "", "bulk: sagas in this status (e.g. stuck)")
	f.StringVar(&b.step, "step", "", "bulk: sagas whose current step is this one")
	f.StringVar(&b.errMatch, "error", "", "bulk: sagas whose last error matches this SQL LIKE pattern (e.g. '%refund hold%')")
	f.StringArrayVar(&b.attrs, "attr", nil, "bulk: sagas whose key or search attribute matches (repeatable): name=value, or name>value, >=, <, <= on a number or time (e.g. customer=ada, 'amount>100')")
	f.DurationVar(&b.older, "older-than", 0, "bulk: sagas started longer ago than this (e.g. 1h)")
	f.DurationVar(&b.idle, "idle-for", 0, "bulk: sagas unchanged for longer than this (e.g. 30m)")
	f.IntVar(&b.limit, "limit", 0, "bulk: at most this many sagas, the newest (default all)")
	f.BoolVar(&b.dryRun, "dry-run", false, "bulk: count and list what would be acted on; change nothing")
	f.StringVar(&b.by, "by", "", "bulk: who acts (required for a bulk action; recorded); the same as --operator")
	return b
}

func (b *bulkFlags) set(cmd *cobra.Command) bool {
	for _, name := range []string{"type", "status", "step", "error", "attr", "older-than", "idle-for", "limit", "dry-run", "by"} {
		if cmd.Flags().Changed(name) {
			return true
		}
	}
	return false
}

func (b *bulkFlags) query() (saga.Query, error) {
	st, err := parseStatus(b.status)
	if err != nil {
		return saga.Query{}, err
	}
	if b.older < 0 || b.idle < 0 || b.limit < 0 {
		return saga.Query{}, usagef("--older-than, --idle-for and --limit must not be negative")
	}
	q := saga.Query{Type: b.typ, Status: st, Step: b.step, Error: b.errMatch, Attrs: b.attrs, Limit: b.limit}
	if q.Type == "" && q.Status == "" && q.Step == "" && q.Error == "" && len(q.Attrs) == 0 {
		return q, usagef("give a saga id, or select sagas with --type, --status, --step, --error or --attr")
	}
	now := time.Now()
	if b.older > 0 {
		q.CreatedBefore = now.Add(-b.older)
	}
	if b.idle > 0 {
		q.UpdatedBefore = now.Add(-b.idle)
	}
	return q, nil
}

// bulkDryRunJSON is the JSON shape of a bulk action's --dry-run: how many
// sagas it selects now, and the newest of them.
type bulkDryRunJSON struct {
	DryRun bool        `json:"dry_run"`
	Action saga.Action `json:"action"`
	Query  saga.Query  `json:"query"`
	Count  int64       `json:"count"`
	Sagas  []sagaJSON  `json:"sagas"`
}

// sagaBulk runs a bulk action (or its dry run) on the sagas the flags
// select: the requests are filed for the service's running orchestrator.
func (a *app) sagaBulk(cmd *cobra.Command, action saga.Action, b *bulkFlags, w *who) error {
	q, err := b.query()
	if err != nil {
		return err
	}
	var by saga.Actor
	if !b.dryRun {
		if b.by != "" {
			w.operator = b.by
		}
		if strings.TrimSpace(w.reason) == "" && a.stdin == nil {
			return usagef("--reason is required: it is recorded in every saga's history")
		}
		if strings.TrimSpace(w.operator) == "" && strings.TrimSpace(a.getenv("USER")) == "" {
			return usagef("--by is required for a bulk action: it is recorded in every saga's history")
		}
		if by, err = a.actor(w, "the bulk "+string(action)); err != nil {
			return err
		}
		if err := a.authorize(cmd, by, "act-bulk", console.Resource{Kind: "saga", Type: q.Type, Op: string(action)}); err != nil {
			return err
		}
	}
	ctx := cmd.Context()
	p, err := a.sagaOperator(ctx)
	if err != nil {
		return err
	}
	if b.dryRun {
		d, err := p.DryRun(ctx, q, 20)
		if errors.Is(err, saga.ErrInvalidQuery) {
			return usageError{err} // a filter it cannot read
		}
		if err != nil {
			return a.explainMissingTables(ctx, err)
		}
		out := bulkDryRunJSON{DryRun: true, Action: action, Query: q, Count: int64(d.Count), Sagas: make([]sagaJSON, 0, len(d.First))}
		for _, in := range d.First {
			out.Sagas = append(out.Sagas, a.toJSON(in))
		}
		return a.emit(out, func(w io.Writer) {
			fmt.Fprintf(w, "dry run: %s would apply to %d sagas; nothing was changed. The newest:\n", action, d.Count)
			sagaRows(w, d.First)
		})
	}
	op, err := p.Bulk(ctx, action, q, by)
	if errors.Is(err, saga.ErrInvalidQuery) {
		return usageError{err}
	}
	if err != nil {
		return a.explainMissingTables(ctx, err)
	}
	return a.emit(op, func(w io.Writer) { printBulk(w, op) })
}

func sagaRows(w io.Writer, sagas []*saga.Instance) {
	rows := make([][]string, 0, len(sagas))
	for _, in := range sagas {
		rows = append(rows, []string{in.ID, in.Type + " v" + strconv.Itoa(in.Version), string(in.Status),
			in.Step, age(time.Since(in.UpdatedAt)), in.LastError})
	}
	table(w, []string{"ID", "TYPE", "STATUS", "STEP", "IDLE", "LAST ERROR"}, rows)
}

func printBulk(w io.Writer, op *saga.BulkOperation) {
	c := op.Counts
	fmt.Fprintf(w, "bulk %s %s by %s (%s)\n", op.Action, op.ID, op.Operator, op.Reason)
	rows := [][]string{{"selected", strconv.FormatInt(c.Selected, 10)}, {"not filed yet", strconv.FormatInt(c.Unfiled, 10)},
		{"filed", strconv.FormatInt(c.Filed, 10)}, {"pending", strconv.FormatInt(c.Pending, 10)},
		{"applied", strconv.FormatInt(c.Applied, 10)}}
	reasons := make([]string, 0, len(c.Refused))
	for r := range c.Refused {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		rows = append(rows, []string{"refused: " + r, strconv.FormatInt(c.Refused[r], 10)})
	}
	table(w, []string{"SAGAS", "COUNT"}, rows)
	if c.Pending > 0 {
		fmt.Fprintf(w, "the service's running orchestrator applies the pending requests; follow them with: millrace saga bulk status %s\n", op.ID)
	}
}

func (a *app) sagaBulkCmd() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "bulk",
		Short: "Bulk actions on sagas: their progress and outcome",
		Long: "A saga action without a saga id (saga retry --status stuck --step reserve_credit --by ... --reason ...)\n" +
			"acts on every saga the selection flags select: it records a bulk operation and files an operator\n" +
			"request on each saga, checked against the saga's state, for the service's running orchestrator.\n" +
			"saga bulk status shows the operation's progress and outcome counts.",
	})
	var wait time.Duration
	status := &cobra.Command{
		Use:   "status OPERATION-ID",
		Short: "Show a bulk operation's progress and outcome counts",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			if wait < 0 {
				return usagef("--wait must not be negative")
			}
			ctx := cmd.Context()
			p, err := a.sagaOperator(ctx)
			if err != nil {
				return err
			}
			deadline := time.Now().Add(wait)
			for {
				op, err := p.BulkStatus(ctx, ids[0])
				if err != nil {
					return a.explainMissingTables(ctx, err)
				}
				if op.Done() || wait == 0 {
					return a.emit(op, func(w io.Writer) { printBulk(w, op) })
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("bulk operation %s not done within %s (%d pending, %d not filed): is the service's orchestrator running?",
						op.ID, wait, op.Counts.Pending, op.Counts.Unfiled)
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(200 * time.Millisecond):
				}
			}
		},
	}
	status.Flags().DurationVar(&wait, "wait", 0, "wait this long for every saga's outcome (e.g. 1m)")
	cmd.AddCommand(status)
	return cmd
}

// deadSelection are the selection flags of a bulk dead-letter action.
type deadSelection struct {
	topic, key, errMatch string
	older                time.Duration
	dryRun               bool
}

func addDeadSelection(cmd *cobra.Command) *deadSelection {
	s := &deadSelection{}
	f := cmd.Flags()
	f.StringVar(&s.topic, "topic", "", "bulk: dead letters of this topic")
	f.StringVar(&s.key, "key", "", "bulk: dead letters of this partition key")
	f.StringVar(&s.errMatch, "error", "", "bulk: dead letters whose last error matches this SQL LIKE pattern (e.g. '%timeout%')")
	f.DurationVar(&s.older, "older-than", 0, "bulk: dead letters that died longer ago than this (e.g. 1h)")
	f.BoolVar(&s.dryRun, "dry-run", false, "bulk: count and list what would be acted on; change nothing")
	return s
}

func (s *deadSelection) set(cmd *cobra.Command) bool {
	for _, name := range []string{"topic", "key", "error", "older-than", "dry-run"} {
		if cmd.Flags().Changed(name) {
			return true
		}
	}
	return false
}

// deadBulkJSON is the JSON shape of a bulk dead-letter action: how many it
// acted on (or, with --dry-run, would), and the first of them.
type deadBulkJSON struct {
	Action   string `json:"action"`
	DryRun   bool   `json:"dry_run"`
	Consumer string `json:"consumer,omitempty"` // inbox
	Topic    string `json:"topic,omitempty"`    // poison: the poison topic
	Count    int    `json:"count"`
	// EventIDs are the first dead letters selected (a poisoned message's
	// UUID), listed by the dry run before the action.
	EventIDs []string `json:"event_ids"`
	// Refused counts the selected ones not acted on, by why (poison).
	Refused map[string]int `json:"refused,omitempty"`
}

// query returns the dead letters' query the flags select, or a usage
// error when they select nothing in particular.
func (s *deadSelection) query() (core.DeadLetterQuery, error) {
	if s.topic == "" && s.key == "" && s.errMatch == "" && s.older == 0 {
		return core.DeadLetterQuery{}, usagef("give event ids, or select dead letters with --topic, --key, --error or --older-than")
	}
	if s.older < 0 {
		return core.DeadLetterQuery{}, usagef("--older-than must not be negative")
	}
	q := core.DeadLetterQuery{Topic: s.topic, PartitionKey: s.key, Error: s.errMatch}
	if s.older > 0 {
		q.DeadBefore = time.Now().Add(-s.older)
	}
	return q, nil
}

// deadBulk runs a bulk dead-letter action, or only its dry run: dryRun
// counts what q selects and lists the first ids, act acts on it, as the
// actor w names, once authorized on res.
func (a *app) deadBulk(cmd *cobra.Command, action, what string, s *deadSelection, w *who, res console.Resource, out deadBulkJSON,
	dryRun func() (int, []string, error), act func(core.Actor) (int, error)) error {
	var by core.Actor
	if !s.dryRun {
		var err error
		if by, err = a.actor(w, action+" of the "+what+" selected"); err != nil {
			return err
		}
		if err := a.authorize(cmd, by, console.Action(action), res); err != nil {
			return err
		}
	}
	n, ids, err := dryRun()
	if err != nil {
		return err
	}
	out.Action, out.DryRun, out.Count, out.EventIDs = action, s.dryRun, n, ids
	if out.EventIDs == nil {
		out.EventIDs = []string{}
	}
	if !s.dryRun {
		if out.Count, err = act(by); err != nil {
			return err
		}
	}
	return a.emit(out, func(w io.Writer) {
		if s.dryRun {
			fmt.Fprintf(w, "dry run: %s would apply to %d %s; nothing was changed. The first: %s\n",
				action, out.Count, what, strings.Join(out.EventIDs, " "))
			return
		}
		fmt.Fprintf(w, "%s %d %s\n", map[string]string{"requeue": "requeued", "discard": "discarded"}[action], out.Count, what)
	})
}

// outboxDeadBulk requeues or discards the outbox dead letters the flags
// select (outbox.Admin.RequeueMatching, DiscardMatching).
func (a *app) outboxDeadBulk(cmd *cobra.Command, action string, s *deadSelection, w *who) error {
	q, err := s.query()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	admin, err := a.outboxAdmin(ctx)
	if err != nil {
		return err
	}
	act := admin.RequeueMatching
	if action == "discard" {
		act = admin.DiscardMatching
	}
	return a.deadBulk(cmd, action, "outbox dead letters", s, w, console.Resource{Kind: "outbox", Type: q.Topic}, deadBulkJSON{}, func() (int, []string, error) {
		d, err := admin.DryRun(ctx, q, 20)
		if err != nil {
			return 0, nil, err
		}
		ids := make([]string, 0, len(d.First))
		for _, dl := range d.First {
			ids = append(ids, dl.EventID)
		}
		return d.Count, ids, nil
	}, func(by core.Actor) (int, error) { return act(ctx, q, by) })
}

// inboxDeadBulk requeues or discards the consumer's inbox dead letters the
// flags select (inbox.DeadLetters.RequeueMatching, DiscardMatching).
func (a *app) inboxDeadBulk(cmd *cobra.Command, consumer, action string, s *deadSelection, w *who) error {
	q, err := s.query()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	dl, err := a.inboxDead(ctx, consumer)
	if err != nil {
		return err
	}
	act := dl.RequeueMatching
	if action == "discard" {
		act = dl.DiscardMatching
	}
	return a.deadBulk(cmd, action, "inbox dead letters of consumer "+strconv.Quote(consumer), s, w, console.Resource{Kind: "inbox", Type: consumer},
		deadBulkJSON{Consumer: consumer}, func() (int, []string, error) {
			d, err := dl.DryRun(ctx, q, 20)
			if err != nil {
				return 0, nil, err
			}
			ids := make([]string, 0, len(d.First))
			for _, e := range d.First {
				ids = append(ids, e.EventID)
			}
			return d.Count, ids, nil
		}, func(by core.Actor) (int, error) { return act(ctx, q, by) })
}
