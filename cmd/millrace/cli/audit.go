package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/internal/redact"
)

// who are the flags of every operator action: who acts and why.
type who struct {
	operator, reason string
}

// addWho adds --operator and --reason to cmd.
func addWho(cmd *cobra.Command) *who {
	w := &who{}
	cmd.Flags().StringVar(&w.reason, "reason", "", "why (required, asked for on a terminal; recorded in the audit trail)")
	cmd.Flags().StringVar(&w.operator, "operator", "", "who acts (default $USER; recorded in the audit trail)")
	return w
}

// actor is who acts for an action (what, as the prompt and the errors
// say it), and why: --operator, else $USER; --reason, else a reason asked
// for on the terminal, else a usage error. It is the same for every
// action, so that each is recorded with who and why.
func (a *app) actor(w *who, what string) (core.Actor, error) {
	operator := strings.TrimSpace(w.operator)
	if operator == "" {
		operator = strings.TrimSpace(a.getenv("USER"))
	}
	if operator == "" {
		return core.Actor{}, usagef("--operator is required when $USER is not set: it is recorded in the audit trail")
	}
	reason := strings.TrimSpace(w.reason)
	if reason == "" && a.stdin != nil {
		fmt.Fprintf(a.stderr, "Reason for %s (recorded in the audit trail): ", what)
		line, err := bufio.NewReader(a.stdin).ReadString('\n')
		if err != nil && err != io.EOF {
			return core.Actor{}, err
		}
		reason = strings.TrimSpace(line)
	}
	if reason == "" {
		return core.Actor{}, usagef("--reason is required: it is recorded in the audit trail")
	}
	host, _ := os.Hostname()
	return core.Actor{Operator: operator, Reason: reason, From: "cli " + operator + "@" + host}, nil
}

// authorize asks Config.Authorize whether by may take action on res: the
// command's own check before the database's privileges (none in the stock
// binary). A refusal changes nothing.
func (a *app) authorize(cmd *cobra.Command, by core.Actor, action console.Action, res console.Resource) error {
	if a.authz == nil {
		return nil
	}
	res.Service = a.schema
	if err := a.authz(cmd.Context(), console.Identity{Name: by.Operator}, action, res); err != nil {
		return fmt.Errorf("forbidden: %s may not %s: %w; nothing was changed", by.Operator, action, err)
	}
	return nil
}

// show is payload as the command prints it (in --json and saga show):
// Config.Redact's choice, else with the values of --redact's fields (every
// value for "*") replaced; nil when hidden. A payload that is not JSON is
// hidden when anything is to be redacted.
func (a *app) show(res console.Resource, payload []byte) []byte {
	if len(payload) == 0 {
		return payload
	}
	if a.redactFn != nil {
		user := strings.TrimSpace(a.getenv("USER"))
		res.Service = a.schema
		return a.redactFn(console.Identity{Name: user}, res, payload)
	}
	if len(a.redact) == 0 {
		return payload
	}
	fields := a.redact
	if len(fields) == 1 && fields[0] == "*" {
		fields = nil
	}
	out, ok := redact.JSON(payload, fields...)
	if !ok {
		return nil
	}
	return out
}

// showJSON is show for a payload printed as JSON: null when hidden, a
// string when it is not JSON.
func (a *app) showJSON(res console.Resource, payload []byte) json.RawMessage {
	out := a.show(res, payload)
	switch {
	case out == nil:
		return json.RawMessage("null")
	case !json.Valid(out):
		raw, _ := json.Marshal(strings.ToValidUTF8(string(out), "\uFFFD"))
		return raw
	}
	return out
}

func (a *app) auditCmd() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "audit",
		Short: "The audit trail: every operator action, who, on whose plan, why, from where",
		Long: "The audit trail (the audit_log table) holds every operator action on the schema, from the console, this\n" +
			"command and Go code, one by one or in bulk, each recorded in the transaction of the action itself:\n" +
			"who acted, on whose plan (a bulk operation confirmed by someone else), why, from where, what, on\n" +
			"which resource, and the state before and after. Retention keeps it 90 days by default.",
	})
	var (
		f     audit.Filter
		since time.Duration
	)
	list := &cobra.Command{
		Use:   "list",
		Short: "List operator actions, newest first (--json: one JSON object a line)",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.Limit < 1 || f.Limit > 1000 || f.Before < 0 || since < 0 {
				return usagef("--limit must be in 1..1000, --before and --since not negative")
			}
			if since > 0 {
				f.Since = time.Now().Add(-since)
			}
			pool, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			list, err := audit.New(a.schema).List(cmd.Context(), pool, f)
			if err != nil {
				return err
			}
			if a.json {
				enc := json.NewEncoder(a.stdout)
				for _, r := range list {
					if err := enc.Encode(r); err != nil {
						return err
					}
				}
				return nil
			}
			rows := make([][]string, 0, len(list))
			for _, r := range list {
				by := r.Operator
				if r.OnBehalfOf != "" {
					by += " (for " + r.OnBehalfOf + ")"
				}
				res := r.Kind
				if r.Scope != "" {
					res += " " + r.Scope
				}
				if r.Target != "" {
					res += " " + r.Target
				}
				rows = append(rows, []string{r.At.UTC().Format("2006-01-02 15:04:05"), by, r.Action, r.Outcome, res, r.Reason, r.Source})
			}
			table(a.stdout, []string{"AT", "OPERATOR", "ACTION", "OUTCOME", "RESOURCE", "REASON", "FROM"}, rows)
			if len(list) == f.Limit {
				fmt.Fprintf(a.stdout, "\nmore may follow: --before %d\n", list[len(list)-1].ID)
			}
			return nil
		},
	}
	fl := list.Flags()
	fl.StringVar(&f.Operator, "operator", "", "only this operator's actions (as the one who acted, or the planner they acted for)")
	fl.StringVar(&f.Action, "action", "", "only this action (saga.retry) or family (saga, outbox, inbox, poison)")
	fl.StringVar(&f.Target, "target", "", "only actions on this resource: a saga id, an event id, a bulk operation id")
	fl.StringVar(&f.Operation, "operation", "", "only the actions of this bulk operation")
	fl.DurationVar(&since, "since", 0, "only actions within this long ago (e.g. 24h)")
	fl.Int64Var(&f.Before, "before", 0, "continue a listing: entries with an id below this one")
	fl.IntVar(&f.Limit, "limit", 100, "most entries listed (1..1000)")
	cmd.AddCommand(list)
	return cmd
}

// payload is a dead letter's or a message's payload as --json prints it:
// JSON as it is, any other payload in base64, each as show lets it
// through; hidden when show hides it.
func (a *app) payload(res console.Resource, raw []byte, binary bool) (asJSON json.RawMessage, base64 []byte, hidden bool) {
	out := a.show(res, raw)
	switch {
	case out == nil && len(raw) > 0:
		return nil, nil, true
	case !binary && json.Valid(out):
		return out, nil, false
	}
	return nil, out, false
}
