package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/millrace/millrace/saga"
)

func (a *app) sagaCmd() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "saga",
		Short: "Sagas: list, inspect, and unstick them",
		Long: "Sagas: list them, show one with its steps and history, and take an operator action on one.\n" +
			"An action (retry, skip, mark-compensated, abort) runs the saga's next step, so it needs the saga's\n" +
			"definition (its Go code): the stock binary has none; a service builds a millrace with its definitions\n" +
			"(package cmd/millrace/cli, Config.Sagas), or uses the console mounted in it (docs/operating.md).\n" +
			"Listing and showing need no definition.",
	})
	cmd.AddCommand(a.sagaListCmd(), a.sagaShowCmd(),
		a.sagaActionCmd("retry", "Retry the current step's action (or compensation) now, with a fresh retry budget",
			(*saga.Orchestrator).Retry),
		a.sagaActionCmd("skip", "Treat the current step as done by hand and move on (forward phase only)",
			(*saga.Orchestrator).Skip),
		a.sagaActionCmd("mark-compensated", "Treat the current step's compensation as done by hand and go on compensating",
			(*saga.Orchestrator).MarkCompensated),
		a.sagaActionCmd("abort", "Stop the forward run and compensate what took effect (before the pivot only)",
			(*saga.Orchestrator).Abort))
	return cmd
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
}

func toJSON(in *saga.Instance) sagaJSON {
	steps := in.Steps
	if steps == nil {
		steps = map[string]*saga.StepState{}
	}
	return sagaJSON{
		ID: in.ID, Type: in.Type, Version: in.Version, Status: in.Status, Phase: in.Phase, Step: in.Step,
		Steps: steps, Data: orNull(in.Data), Input: orNull(in.Input), Revision: in.Revision, Attempts: in.Attempts,
		LastError: in.LastError, CreatedAt: in.CreatedAt, UpdatedAt: in.UpdatedAt, EndedAt: in.EndedAt,
		NextWakeupAt: in.NextWakeupAt, DeadlineAt: in.DeadlineAt,
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

var statuses = []saga.Status{saga.StatusRunning, saga.StatusCompensating, saga.StatusStuck, saga.StatusCompleted, saga.StatusCompensated}

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
	var typ, status, cursor string
	var older time.Duration
	var limit int
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List sagas newest first, by type, status and age, a page at a time",
		Long: "List sagas newest first, filtered by --type, --status and --older-than, a page at a time:\n" +
			"the next page's --cursor is printed after the table (\"next\" with --json).",
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
			p := saga.ListParams{Type: typ, Status: st, Cursor: cursor, Limit: limit}
			if older > 0 {
				p.CreatedBefore = time.Now().Add(-older)
			}
			res, err := o.List(cmd.Context(), p)
			if errors.Is(err, saga.ErrInvalidCursor) {
				return usageError{fmt.Errorf("--cursor: %w", err)}
			}
			if err != nil {
				return err
			}
			out := sagaList{Sagas: make([]sagaJSON, 0, len(res.Sagas)), Next: res.Next}
			for _, in := range res.Sagas {
				out.Sagas = append(out.Sagas, toJSON(in))
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
	f.StringVar(&status, "status", "", "only sagas in this status: running, compensating, stuck, completed, compensated")
	f.DurationVar(&older, "older-than", 0, "only sagas started longer ago than this (e.g. 1h)")
	f.StringVar(&cursor, "cursor", "", "continue a listing where the previous page ended")
	f.IntVar(&limit, "limit", 50, "page size (1..1000)")
	return cmd
}

type sagaShow struct {
	Saga    sagaJSON      `json:"saga"`
	History []historyJSON `json:"history"`
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
			out := sagaShow{Saga: toJSON(in), History: make([]historyJSON, 0, len(hist))}
			for _, h := range hist {
				out.History = append(out.History, historyJSON{ID: h.ID, At: h.At, Event: h.Event, Step: h.Step,
					Operation: h.Operation, Attempt: h.Attempt, Outcome: h.Outcome, Status: h.Status, Actor: h.Actor,
					Reason: h.Reason, Detail: orNull(h.Detail)})
			}
			return a.emit(out, func(w io.Writer) { printSaga(w, in, hist) })
		},
	}
}

func printSaga(w io.Writer, in *saga.Instance, hist []saga.HistoryEntry) {
	when := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.UTC().Format(time.RFC3339)
	}
	table(w, []string{"FIELD", "VALUE"}, [][]string{
		{"id", in.ID}, {"type", in.Type + " v" + strconv.Itoa(in.Version)}, {"status", string(in.Status)},
		{"phase", string(in.Phase)}, {"current step", in.Step}, {"attempts", strconv.Itoa(in.Attempts)},
		{"started", in.CreatedAt.UTC().Format(time.RFC3339)},
		{"updated", in.UpdatedAt.UTC().Format(time.RFC3339)}, {"next wake-up", when(in.NextWakeupAt)},
		{"deadline", when(in.DeadlineAt)}, {"ended", when(in.EndedAt)},
	})
	if in.LastError != "" {
		fmt.Fprintf(w, "\nlast error: %s\n", oneLine(in.LastError))
	}
	fmt.Fprintf(w, "\ndata: %s\n\n", in.Data)
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
	rows = rows[:0]
	for _, h := range hist {
		rows = append(rows, []string{h.At.UTC().Format("2006-01-02 15:04:05.000"), h.Event, h.Step, h.Operation,
			strconv.Itoa(h.Attempt), h.Outcome, string(h.Status), h.Actor, h.Reason})
	}
	table(w, []string{"AT", "EVENT", "STEP", "OPERATION", "ATTEMPT", "OUTCOME", "STATUS", "OPERATOR", "REASON"}, rows)
}

type sagaAction func(o *saga.Orchestrator, ctx context.Context, id string, by saga.Actor) (*saga.Instance, error)

func (a *app) sagaActionCmd(name, short string, act sagaAction) *cobra.Command {
	var reason, operator string
	cmd := &cobra.Command{
		Use:   name + " ID --reason TEXT",
		Short: short,
		Long: short + ".\nThe action is checked against the saga's state: a refused one changes nothing. " +
			"The operator\n(--operator, default $USER) and the reason are recorded in the saga's history.",
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			if strings.TrimSpace(reason) == "" {
				return usagef("--reason is required: it is recorded in the saga's history")
			}
			if operator == "" {
				operator = a.getenv("USER")
			}
			if strings.TrimSpace(operator) == "" {
				return usagef("--operator is required when $USER is not set")
			}
			o, err := a.orchestrator(cmd.Context())
			if err != nil {
				return err
			}
			in, err := act(o, cmd.Context(), ids[0], saga.Actor{Operator: operator, Reason: reason})
			if errors.Is(err, saga.ErrNotRegistered) {
				return fmt.Errorf("%w: this millrace binary does not have the saga's definition; "+
					"use a millrace built with it (package cmd/millrace/cli, Config.Sagas) "+
					"or the console mounted in the service that runs the saga", err)
			}
			if err != nil {
				return err
			}
			return a.emit(toJSON(in), func(w io.Writer) {
				fmt.Fprintf(w, "%s of saga %s done by %s: now %s", name, in.ID, operator, in.Status)
				if in.Step != "" {
					fmt.Fprintf(w, " at step %s", in.Step)
				}
				fmt.Fprintln(w)
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (required; recorded)")
	cmd.Flags().StringVar(&operator, "operator", "", "who acts (default $USER; recorded)")
	return cmd
}
