package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

func (a *app) sagaCmd() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "saga",
		Short: "Sagas: list, inspect, and unstick them",
		Long: "Sagas: list them, show one with its steps and history, and take an operator action on one.\n" +
			"An action (retry, skip, mark-compensated, abort, pause, resume) runs the saga's next step, which takes the saga's\n" +
			"definition (its Go code). The stock binary has none: it records an operator request, checked against\n" +
			"the saga's state, that the service's running orchestrator applies on its next timer pass. A millrace\n" +
			"built with the definitions (package cmd/millrace/cli, Config.Sagas) acts at once (docs/operating.md).\n" +
			"Listing, showing and withdrawing a pending request (saga withdraw) need no definition; saga signal sends an\n" +
			"event to a waiting saga (by id or by correlation key), stored for the orchestrator when this binary has no definition.",
	})
	cmd.AddCommand(a.sagaListCmd(), a.sagaShowCmd(),
		a.sagaActionCmd(saga.ActionRetry, "Retry the current step's action (or compensation) now, with a fresh retry budget",
			(*saga.Orchestrator).Retry),
		a.sagaActionCmd(saga.ActionSkip, "Treat the current step as done by hand and move on (forward phase only)",
			(*saga.Orchestrator).Skip),
		a.sagaActionCmd(saga.ActionMarkCompensated, "Treat the current step's compensation as done by hand and go on compensating",
			(*saga.Orchestrator).MarkCompensated),
		a.sagaActionCmd(saga.ActionAbort, "Stop the forward run and compensate what took effect (before the pivot only; cancels a scheduled saga)",
			(*saga.Orchestrator).Abort),
		a.sagaActionCmd(saga.ActionPause, "Pause a running or compensating saga: no next step, no timer; replies are held until resume",
			(*saga.Orchestrator).Pause),
		a.sagaActionCmd(saga.ActionResume, "Resume a paused saga: its timeout and deadline pushed by the paused time, held replies applied in order",
			(*saga.Orchestrator).Resume),
		a.sagaWithdrawCmd(), a.sagaBulkCmd(), a.sagaSignalCmd())
	return cmd
}

// withdrawJSON is the JSON shape of saga withdraw: the request withdrawn
// and the saga.
type withdrawJSON struct {
	Withdrawn saga.Request `json:"withdrawn"`
	Saga      sagaJSON     `json:"saga"`
}

func (a *app) sagaWithdrawCmd() *cobra.Command {
	var w *who
	cmd := &cobra.Command{
		Use:   "withdraw ID --reason TEXT",
		Short: "Withdraw a saga's pending operator request before the orchestrator applies it",
		Long: "Withdraw a saga's pending operator request (recorded by the stock binary or a console without the\n" +
			"definitions) before the service's orchestrator applies it. The operator (--operator, default $USER),\n" +
			"the reason and the request withdrawn are recorded in the saga's history and the audit trail. Nothing else changes.",
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			by, err := a.actor(w, "the withdrawal")
			if err != nil {
				return err
			}
			if err := a.authorize(cmd, by, "act", console.Resource{Kind: "saga", ID: ids[0], Op: "withdraw"}); err != nil {
				return err
			}
			operator := by.Operator
			p, err := a.sagaOperator(cmd.Context())
			if err != nil {
				return err
			}
			r, err := p.Withdraw(cmd.Context(), ids[0], by)
			if err != nil {
				return err
			}
			o, err := a.orchestrator(cmd.Context())
			if err != nil {
				return err
			}
			in, err := o.Get(cmd.Context(), ids[0])
			if err != nil {
				return err
			}
			return a.emit(withdrawJSON{Withdrawn: *r, Saga: a.toJSON(in)}, func(w io.Writer) {
				fmt.Fprintf(w, "%s of saga %s requested by %s at %s: withdrawn by %s; the saga is %s\n",
					r.Action, in.ID, r.Operator, r.RequestedAt.UTC().Format(time.RFC3339), operator, in.Status)
			})
		},
	}
	w = addWho(cmd)
	return cmd
}

// sagaOperator returns an Orchestrator without definitions on the schema: it records
// operator requests for the service's running orchestrator.
func (a *app) sagaOperator(ctx context.Context) (*saga.Orchestrator, error) {
	pool, err := a.connect(ctx)
	if err != nil {
		return nil, err
	}
	return saga.New(pool, saga.Config{Schema: a.schema})
}

// orchestrator returns an Orchestrator on the schema with the saga
// definitions this binary has (a.register).
func (a *app) orchestrator(ctx context.Context) (*saga.Orchestrator, error) {
	pool, err := a.connect(ctx)
	if err != nil {
		return nil, err
	}
	o, err := saga.New(pool, saga.Config{Schema: a.schema})
	if err != nil {
		return nil, err
	}
	if a.register != nil {
		if err := a.register(o); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// sagaJSON is the JSON shape of a saga.
type sagaJSON struct {
	ID           string                     `json:"id"`
	Type         string                     `json:"type"`
	Version      int                        `json:"version"`
	Status       saga.Status                `json:"status"`
	Phase        saga.Phase                 `json:"phase"`
	Step         string                     `json:"step"`
	Steps        map[string]*saga.StepState `json:"steps"`
	Data         json.RawMessage            `json:"data"`
	Input        json.RawMessage            `json:"input"`
	Revision     int64                      `json:"revision"`
	Attempts     int                        `json:"attempts"`
	LastError    string                     `json:"last_error"`
	CreatedAt    time.Time                  `json:"created_at"`
	UpdatedAt    time.Time                  `json:"updated_at"`
	EndedAt      *time.Time                 `json:"ended_at"`
	NextWakeupAt *time.Time                 `json:"next_wakeup_at"`
	DeadlineAt   *time.Time                 `json:"deadline_at"`
	// Request is the operator request waiting for the orchestrator.
	Request *saga.Request `json:"request"`
	// Parent is the saga whose child step started this one, "" if none.
	Parent string `json:"parent,omitempty"`
	// Attributes are its keys and search attributes (show only).
	Attributes map[string]string `json:"attributes,omitempty"`
}

// toJSON is in as --json prints it, its data and input as show lets them
// through.
func (a *app) toJSON(in *saga.Instance) sagaJSON {
	steps := in.Steps
	if steps == nil {
		steps = map[string]*saga.StepState{}
	}
	res := console.Resource{Kind: "saga", Type: in.Type, ID: in.ID}
	return sagaJSON{
		ID: in.ID, Type: in.Type, Version: in.Version, Status: in.Status, Phase: in.Phase, Step: in.Step,
		Steps: steps, Data: orNull(a.showJSON(res, in.Data)), Input: orNull(a.showJSON(res, in.Input)), Revision: in.Revision, Attempts: in.Attempts,
		LastError: in.LastError, CreatedAt: in.CreatedAt, UpdatedAt: in.UpdatedAt, EndedAt: in.EndedAt,
		NextWakeupAt: in.NextWakeupAt, DeadlineAt: in.DeadlineAt, Request: in.Request, Parent: in.Parent, Attributes: in.Attributes,
	}
}

func orNull(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return json.RawMessage("null")
	}
	return raw
}

type historyJSON struct {
	ID        int64           `json:"id"`
	At        time.Time       `json:"at"`
	Event     string          `json:"event"`
	Step      string          `json:"step"`
	Operation string          `json:"operation"`
	Attempt   int             `json:"attempt"`
	Outcome   string          `json:"outcome"`
	Status    saga.Status     `json:"status"`
	Actor     string          `json:"actor"`
	Reason    string          `json:"reason"`
	Detail    json.RawMessage `json:"detail"`
}

type sagaList struct {
	Sagas []sagaJSON `json:"sagas"`
	Next  string     `json:"next"`
}

var statuses = []saga.Status{saga.StatusRunning, saga.StatusCompensating, saga.StatusStuck, saga.StatusCompleted, saga.StatusCompensated,
	saga.StatusPaused, saga.StatusScheduled}

func parseStatus(s string) (saga.Status, error) {
	if s == "" {
		return "", nil
	}
	for _, st := range statuses {
		if string(st) == s {
			return st, nil
		}
	}
	names := make([]string, len(statuses))
	for i, st := range statuses {
		names[i] = string(st)
	}
	return "", usagef("--status %q: want one of %s", s, strings.Join(names, ", "))
}

func (a *app) sagaListCmd() *cobra.Command {
	var typ, status, cursor, step, errMatch string
	var attrs []string
	var older time.Duration
	var limit int
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List sagas newest first, by type, status, step, last error, age and attributes, a page at a time",
		Long: "List sagas newest first, filtered by --type, --status, --step, --error, --older-than and --attr, a page at a time:\n" +
			"the next page's --cursor is printed after the table (\"next\" with --json). --attr filters by the keys and\n" +
			"search attributes the saga's definition declares (Spec.Keys, Spec.Attributes), repeatable, all must match:\n" +
			"name=value (a key, a text, or a number or time equal to it), or name>value, >=, <, <= on a number or a time\n" +
			"(RFC 3339 or 2006-01-02): --attr customer=ada --attr 'amount>100'.",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := parseStatus(status)
			if err != nil {
				return err
			}
			if limit < 1 || limit > 1000 {
				return usagef("--limit must be in 1..1000")
			}
			if older < 0 {
				return usagef("--older-than must not be negative")
			}
			o, err := a.orchestrator(cmd.Context())
			if err != nil {
				return err
			}
			p := saga.ListParams{Type: typ, Status: st, Step: step, Error: errMatch, Attrs: attrs, Cursor: cursor, Limit: limit}
			if older > 0 {
				p.CreatedBefore = time.Now().Add(-older)
			}
			res, err := o.List(cmd.Context(), p)
			if errors.Is(err, saga.ErrInvalidCursor) {
				return usageError{fmt.Errorf("--cursor: %w", err)}
			}
			if errors.Is(err, core.ErrInvalidListParams) {
				return usageError{fmt.Errorf("--attr: %w", err)}
			}
			if err != nil {
				return err
			}
			out := sagaList{Sagas: make([]sagaJSON, 0, len(res.Sagas)), Next: res.Next}
			for _, in := range res.Sagas {
				out.Sagas = append(out.Sagas, a.toJSON(in))
			}
			return a.emit(out, func(w io.Writer) {
				rows := make([][]string, 0, len(res.Sagas))
				for _, in := range res.Sagas {
					rows = append(rows, []string{in.ID, in.Type + " v" + strconv.Itoa(in.Version), string(in.Status),
						in.Step, age(time.Since(in.CreatedAt)), age(time.Since(in.UpdatedAt)), in.LastError})
				}
				table(w, []string{"ID", "TYPE", "STATUS", "STEP", "AGE", "IDLE", "LAST ERROR"}, rows)
				if res.Next != "" {
					fmt.Fprintf(w, "next page: --cursor %s\n", res.Next)
				}
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&typ, "type", "", "only sagas of this type")
	f.StringVar(&step, "step", "", "only sagas whose current step is this one")
	f.StringVar(&errMatch, "error", "", "only sagas whose last error matches this SQL LIKE pattern (e.g. '%refund hold%')")
	f.StringArrayVar(&attrs, "attr", nil, "only sagas whose key or search attribute matches (repeatable): name=value, or name>value, >=, <, <= on a number or time (e.g. customer=ada, 'amount>100')")
	f.StringVar(&status, "status", "", "only sagas in this status: running, compensating, stuck, completed, compensated, paused, scheduled")
	f.DurationVar(&older, "older-than", 0, "only sagas started longer ago than this (e.g. 1h)")
	f.StringVar(&cursor, "cursor", "", "continue a listing where the previous page ended")
	f.IntVar(&limit, "limit", 50, "page size (1..1000)")
	return a.listing(cmd)
}

type sagaShow struct {
	Saga    sagaJSON      `json:"saga"`
	History []historyJSON `json:"history"`
	// Children are the sagas its child steps started (saga.Step.Child),
	// newest first.
	Children []childJSON `json:"children"`
}

// childJSON is a child saga as show lists it.
type childJSON struct {
	ID     string      `json:"id"`
	Type   string      `json:"type"`
	Status saga.Status `json:"status"`
	Step   string      `json:"step"`
}

func (a *app) sagaShowCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "show ID",
		Short: "Show one saga: its data, current step, steps' states and history",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			o, err := a.orchestrator(cmd.Context())
			if err != nil {
				return err
			}
			in, err := o.Get(cmd.Context(), ids[0])
			if err != nil {
				return err
			}
			hist, err := o.History(cmd.Context(), ids[0])
			if err != nil {
				return err
			}
			kids, err := o.List(cmd.Context(), saga.ListParams{Parent: in.ID, Limit: 1000})
			if err != nil {
				return err
			}
			out := sagaShow{Saga: a.toJSON(in), History: make([]historyJSON, 0, len(hist)), Children: make([]childJSON, 0, len(kids.Sagas))}
			for _, h := range hist {
				out.History = append(out.History, historyJSON{ID: h.ID, At: h.At, Event: h.Event, Step: h.Step,
					Operation: h.Operation, Attempt: h.Attempt, Outcome: h.Outcome, Status: h.Status, Actor: h.Actor,
					Reason: h.Reason, Detail: orNull(h.Detail)})
			}
			for _, k := range kids.Sagas {
				out.Children = append(out.Children, childJSON{ID: k.ID, Type: k.Type, Status: k.Status, Step: k.Step})
			}
			return a.emit(out, func(w io.Writer) { printSaga(w, in, out.Saga.Data, hist, out.Children) })
		},
	}
}

// printSaga prints in for people, with its data as shown (redacted).
func printSaga(w io.Writer, in *saga.Instance, data json.RawMessage, hist []saga.HistoryEntry, kids []childJSON) {
	when := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.UTC().Format(time.RFC3339)
	}
	phase := string(in.Phase)
	if in.EndedAt != nil {
		phase = "ended" // the phase it ended in is its status
	}
	table(w, []string{"FIELD", "VALUE"}, [][]string{
		{"id", in.ID}, {"type", in.Type + " v" + strconv.Itoa(in.Version)}, {"status", string(in.Status)},
		{"phase", phase}, {"current step", in.Step}, {"attempts", strconv.Itoa(in.Attempts)},
		{"started", in.CreatedAt.UTC().Format(time.RFC3339)},
		{"updated", in.UpdatedAt.UTC().Format(time.RFC3339)}, {"next wake-up", when(in.NextWakeupAt)},
		{"deadline", when(in.DeadlineAt)}, {"ended", when(in.EndedAt)},
	})
	if in.Parent != "" {
		fmt.Fprintf(w, "\nparent: %s (millrace saga show %s)\n", in.Parent, in.Parent)
	}
	if in.LastError != "" {
		fmt.Fprintf(w, "\nlast error: %s\n", oneLine(in.LastError))
	}
	if r := in.Request; r != nil {
		by := r.Operator
		if r.OnBehalfOf != "" {
			by += " on behalf of " + r.OnBehalfOf
		}
		fmt.Fprintf(w, "\npending operator request: %s by %s at %s (%s), waiting for the orchestrator\n",
			r.Action, by, r.RequestedAt.UTC().Format(time.RFC3339), oneLine(r.Reason))
	}
	if len(in.Attributes) > 0 {
		names := slices.Sorted(maps.Keys(in.Attributes))
		for i, n := range names {
			names[i] = n + "=" + in.Attributes[n]
		}
		fmt.Fprintf(w, "\nkeys and attributes: %s\n", strings.Join(names, " "))
	}
	fmt.Fprintf(w, "\ndata: %s\n\n", data)
	// Steps in the order they were first sent (the state is keyed by name;
	// the definition's order is in Go code), those never sent last.
	names := make([]string, 0, len(in.Steps))
	for name := range in.Steps {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := in.Steps[names[i]].StartedAt, in.Steps[names[j]].StartedAt
		switch {
		case a != nil && b != nil && !a.Equal(*b):
			return a.Before(*b)
		case (a == nil) != (b == nil):
			return a != nil
		}
		return names[i] < names[j]
	})
	rows := make([][]string, 0, len(names))
	for _, name := range names {
		st := in.Steps[name]
		rows = append(rows, []string{name, st.Status, strconv.Itoa(st.Attempt), strconv.Itoa(st.CompensationAttempt),
			strconv.Itoa(st.Tries), when(st.Due), st.Reason})
	}
	table(w, []string{"STEP", "STATE", "ATTEMPT", "COMP ATTEMPT", "TRIES", "DUE", "REASON"}, rows)
	fmt.Fprintln(w)
	if len(kids) > 0 {
		rows = rows[:0]
		for _, k := range kids {
			rows = append(rows, []string{k.ID, k.Type, string(k.Status), k.Step})
		}
		table(w, []string{"CHILD SAGA", "TYPE", "STATUS", "STEP"}, rows)
		fmt.Fprintln(w)
	}
	rows = rows[:0]
	for _, h := range hist {
		rows = append(rows, []string{h.At.UTC().Format("2006-01-02 15:04:05.000"), h.Event, h.Step, h.Operation,
			strconv.Itoa(h.Attempt), h.Outcome, string(h.Status), h.Actor, h.Reason + arrival(h)})
	}
	table(w, []string{"AT", "EVENT", "STEP", "OPERATION", "ATTEMPT", "OUTCOME", "STATUS", "OPERATOR", "REASON"}, rows)
}

// arrival says when an event line's event arrived, if not when the line
// was written (it waited: held for a paused saga, stored before the wait).
func arrival(h saga.HistoryEntry) string {
	var d struct {
		At time.Time `json:"arrived_at"`
	}
	if h.Event != "event" || json.Unmarshal(h.Detail, &d) != nil || d.At.IsZero() || d.At.Equal(h.At) {
		return ""
	}
	return " (arrived " + d.At.UTC().Format("2006-01-02 15:04:05.000") + ")"
}

type sagaAction func(o *saga.Orchestrator, ctx context.Context, id string, by saga.Actor) (*saga.Instance, error)

// requestJSON is the JSON shape of an operator request recorded by the
// stock binary (no definitions): the request, whether the orchestrator
// has applied it yet (--wait) and how, and the saga.
type requestJSON struct {
	Request saga.Request `json:"request"`
	// Outcome is "pending" (not applied yet), "applied", "refused" or
	// "withdrawn" (or "unknown" if the history does not say).
	Outcome string `json:"outcome"`
	// Refusal is why the orchestrator refused it, or who withdrew it and
	// why.
	Refusal string   `json:"refusal,omitempty"`
	Saga    sagaJSON `json:"saga"`
}

func (a *app) sagaActionCmd(action saga.Action, short string, act sagaAction) *cobra.Command {
	name := string(action)
	var w *who
	var wait time.Duration
	var bulk *bulkFlags
	cmd := &cobra.Command{
		Use:   name + " [ID] --reason TEXT",
		Short: short,
		Long: short + ".\nThe action is checked against the saga's state: a refused one changes nothing. " +
			"The operator\n(--operator, default $USER) and the reason are recorded in the saga's history.\n" +
			"A millrace built with the saga definitions (Config.Sagas) acts at once. The stock binary has none:\n" +
			"it records an operator request that the service's running orchestrator applies on its next timer\n" +
			"pass (an Orchestrator without definitions: saga.Orchestrator.Request); --wait waits for that and prints the outcome.\n" +
			"Without an ID it is a bulk action on every saga the selection flags select (--type, --status, --step,\n" +
			"--error, --older-than, --idle-for, --limit; --by and --reason required): first --dry-run to count and\n" +
			"list them, then the action, which files a request on each for the running orchestrator (saga bulk status).",
		Args: args(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			if len(ids) == 0 {
				return a.sagaBulk(cmd, action, bulk, w)
			}
			if bulk.set(cmd) {
				return usagef("the selection flags are for a bulk action: give a saga id or the flags, not both")
			}
			if wait < 0 {
				return usagef("--wait must not be negative")
			}
			by, err := a.actor(w, name+" of saga "+ids[0])
			if err != nil {
				return err
			}
			if err := a.authorize(cmd, by, "act", console.Resource{Kind: "saga", ID: ids[0], Op: name}); err != nil {
				return err
			}
			operator := by.Operator
			if a.register == nil {
				return a.sagaRequest(cmd.Context(), ids[0], action, by, wait)
			}
			o, err := a.orchestrator(cmd.Context())
			if err != nil {
				return err
			}
			in, err := act(o, cmd.Context(), ids[0], by)
			if errors.Is(err, saga.ErrNotRegistered) {
				return fmt.Errorf("%w: this millrace binary does not have the saga's definition; "+
					"use the stock millrace (it records a request for the service's orchestrator), "+
					"a millrace built with the definition, or the console mounted in the service that runs the saga", err)
			}
			if err != nil {
				return err
			}
			return a.emit(a.toJSON(in), func(w io.Writer) {
				fmt.Fprintf(w, "%s of saga %s done by %s: now %s", name, in.ID, operator, in.Status)
				if in.Step != "" {
					fmt.Fprintf(w, " at step %s", in.Step)
				}
				fmt.Fprintln(w)
			})
		},
	}
	w = addWho(cmd)
	cmd.Flags().DurationVar(&wait, "wait", 0, "stock binary: wait this long for the running orchestrator to apply the request (e.g. 30s)")
	bulk = addBulkFlags(cmd) // bulk.go
	return cmd
}

// sagaRequest records an operator request (an Orchestrator without definitions: saga.Orchestrator.Request) and, with
// wait, polls until the orchestrator has applied or refused it.
func (a *app) sagaRequest(ctx context.Context, id string, action saga.Action, by saga.Actor, wait time.Duration) error {
	p, err := a.sagaOperator(ctx)
	if err != nil {
		return err
	}
	in, err := p.Request(ctx, id, action, by)
	if err != nil {
		return err
	}
	req := *in.Request
	out := requestJSON{Request: req, Outcome: "pending", Saga: a.toJSON(in)}
	if wait > 0 {
		o, err := a.orchestrator(ctx)
		if err != nil {
			return err
		}
		deadline := time.Now().Add(wait)
		for {
			if in, err = o.Get(ctx, id); err != nil {
				return err
			}
			if in.Request == nil || !in.Request.RequestedAt.Equal(req.RequestedAt) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s of saga %q by %s recorded but not applied within %s: is the service's orchestrator running (Orchestrator.Run)? "+
					"The request stays pending", action, id, by.Operator, wait)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
		hist, err := o.History(ctx, id)
		if err != nil {
			return err
		}
		out.Outcome, out.Refusal = requestOutcome(hist, req)
		out.Saga = a.toJSON(in)
		if out.Outcome == "refused" {
			return fmt.Errorf("%s of saga %q refused by the orchestrator when it came to apply it: %s", action, id, out.Refusal)
		}
		if out.Outcome == "withdrawn" {
			return fmt.Errorf("%s of saga %q %s", action, id, out.Refusal)
		}
	}
	return a.emit(out, func(w io.Writer) {
		if out.Outcome == "pending" {
			fmt.Fprintf(w, "%s of saga %s requested by %s: recorded; the service's running orchestrator applies it on its next timer pass "+
				"(see saga show %s, or use --wait)\n", action, id, by.Operator, id)
			return
		}
		how := "applied by the orchestrator"
		if out.Outcome != "applied" {
			how = "no longer pending (see saga show " + id + ")"
		}
		fmt.Fprintf(w, "%s of saga %s requested by %s: %s, now %s", action, id, by.Operator, how, in.Status)
		if in.Step != "" {
			fmt.Fprintf(w, " at step %s", in.Step)
		}
		fmt.Fprintln(w)
	})
}

// requestOutcome finds in the history what became of the request: the
// operator or operator_refused entry after the requester's last
// operator_request entry ("unknown" if there is none).
func requestOutcome(hist []saga.HistoryEntry, req saga.Request) (outcome, refusal string) {
	outcome = "unknown"
	for _, h := range hist {
		if h.Actor != req.Operator && h.Event != "operator_withdrawn" {
			continue
		}
		switch h.Event {
		case "operator_request":
			outcome, refusal = "pending", ""
		case "operator":
			if outcome == "pending" {
				outcome = "applied"
			}
		case "operator_withdrawn":
			if outcome == "pending" {
				outcome, refusal = "withdrawn", "withdrawn by "+h.Actor+": "+h.Reason
			}
		case "operator_refused":
			if outcome == "pending" {
				var d struct {
					Error string `json:"error"`
				}
				_ = json.Unmarshal(h.Detail, &d)
				outcome, refusal = "refused", d.Error
			}
		}
	}
	if outcome == "pending" {
		outcome = "unknown"
	}
	return outcome, refusal
}
