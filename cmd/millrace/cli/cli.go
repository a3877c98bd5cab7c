// Package cli is the millrace command (cmd/millrace) as a library, for a
// service that builds its own operator binary with its saga definitions
// registered, so that the saga actions (retry, skip, mark-compensated,
// abort) can run the saga's next step:
//
//	func main() { os.Exit(cli.Main(cli.Config{Sagas: orders.RegisterSagas})) }
//
// Without definitions (the stock binary) a saga action is recorded as an
// operator request for the service's running orchestrator; everything
// else works the same. See cmd/millrace for the commands.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/migrations"
	"github.com/millrace/millrace/saga"
)

// Config adapts the command to a service that builds its own millrace
// binary (see the package example).
type Config struct {
	// Sagas registers the service's saga definitions with the Orchestrator
	// the saga commands act through. An operator action (retry, skip,
	// mark-compensated, abort) runs the saga's next step, which is the
	// definition's Go code: only a binary built with the definitions can
	// take it at once. Defaults to none (the stock binary): listing and
	// showing work for every saga, and an action records an operator
	// request (an Orchestrator without definitions: saga.Orchestrator.Request), checked against the saga's state, that the
	// service's running orchestrator applies on its next timer pass.
	Sagas func(*saga.Orchestrator) error
	// Authorize says whether the operator (--operator, else $USER) may
	// take an action (console.Action) on a resource, before it is taken;
	// its error refuses it and changes nothing. Resource.Service is the
	// schema. Defaults to none: the database's privileges decide.
	Authorize func(ctx context.Context, who console.Identity, action console.Action, res console.Resource) error
	// Redact decides what of a payload the command prints (saga show,
	// and --json: a saga's data and input, a dead letter's payload, a
	// poisoned message's), as console.Config.Redact, for the identity
	// $USER. Defaults to the --redact flag's fields.
	Redact func(who console.Identity, res console.Resource, payload []byte) []byte
	// Stdin is where a reason an action lacks (--reason) is asked for.
	// Defaults to the terminal in Main (none when stdin is not a
	// terminal: --reason is then required), none in Run.
	Stdin io.Reader
}

// Main runs the command line of the process (os.Args, the environment,
// stdout and stderr; SIGINT and SIGTERM cancel it) and returns its exit
// status: 0 done, 1 failed, 2 usage error.
func Main(cfg Config) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if st, err := os.Stdin.Stat(); cfg.Stdin == nil && err == nil && st.Mode()&os.ModeCharDevice != 0 {
		cfg.Stdin = os.Stdin // a terminal: ask for a missing reason
	}
	return Run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv, cfg)
}

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// usageError is a mistake on the command line (unknown flag, bad value,
// missing argument): exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// app is one run of the command: its flags, output and lazily opened pool.
type app struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	databaseURL    string
	schema         string   // the schema a command works on
	schemaList     []string // --schema, repeatable
	allSchemas     bool     // --all-schemas
	json           bool
	// collected holds what emit was given, per schema, while eachSchema
	// runs a listing over several schemas; nil otherwise.
	collected *[]schemaOutput
	pool      *pgxpool.Pool
	// register adds the saga definitions this binary knows to an
	// Orchestrator (Config.Sagas); nil in the stock binary.
	register func(*saga.Orchestrator) error
	// authz is Config.Authorize, redactFn Config.Redact, stdin
	// Config.Stdin; redact is --redact.
	authz    func(ctx context.Context, who console.Identity, action console.Action, res console.Resource) error
	redactFn func(who console.Identity, res console.Resource, payload []byte) []byte
	stdin    io.Reader
	redact   []string
}

// run is Run with the stock binary's Config.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	return Run(ctx, args, stdout, stderr, getenv, Config{})
}

// Run executes the command line args (without the program name) and
// returns the exit status; getenv reads the environment (DATABASE_URL,
// USER).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string, cfg Config) int {
	a := &app{stdout: stdout, stderr: stderr, getenv: getenv, register: cfg.Sagas, authz: cfg.Authorize, redactFn: cfg.Redact, stdin: cfg.Stdin}
	root := a.rootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if a.pool != nil {
		err = a.explainMissingTables(ctx, err)
		a.pool.Close()
	}
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "millrace: "+oneLine(err.Error()))
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitFail
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func (a *app) rootCmd() *cobra.Command {
	root := group(&cobra.Command{
		Use:           "millrace",
		Short:         "Operate millrace's outbox, inboxes, sagas and migrations",
		Long:          "millrace operates the tables of the millrace library in a PostgreSQL schema: migrations, the outbox\nbacklog and dead letters, replay, the inboxes' dead letters, and a web console.",
		SilenceUsage:  true,
		SilenceErrors: true,
	})
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&a.databaseURL, "database-url", "", "PostgreSQL connection URL (default $DATABASE_URL)")
	pf.StringArrayVar(&a.schemaList, "schema", []string{"millrace"}, "schema that holds millrace's tables (one service's); listings take it repeatedly")
	pf.BoolVar(&a.allSchemas, "all-schemas", false, "listings: every schema that holds millrace's tables")
	pf.BoolVar(&a.json, "json", false, "print JSON instead of a table")
	pf.StringSliceVar(&a.redact, "redact", nil, "payloads printed (saga show, --json): replace the values of these JSON fields (\"*\": every value)")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		many := cmd.Annotations[annotationSchemas] == "many"
		switch {
		case a.allSchemas && !many:
			return usagef("%s works on one schema: --all-schemas is for listings (%s)", cmd.CommandPath(), strings.Join(multiSchemaCommands, ", "))
		case len(a.schemaList) > 1 && !many:
			return usagef("%s works on one schema: pass --schema once", cmd.CommandPath())
		case a.allSchemas && cmd.Flags().Changed("schema"):
			return usagef("pass --schema or --all-schemas, not both")
		}
		a.schema = a.schemaList[0]
		return nil
	}
	root.AddCommand(a.migrateCmd(), a.outboxCmd(), a.inboxCmd(), a.sagaCmd(), a.poisonCmd(), a.kafkaCmd(), a.consoleCmd(), a.conformCmd(),
		a.auditCmd(), loggingTopic())
	return root
}

// args wraps a cobra positional-argument check so that its failure is a
// usage error.
func args(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return usageError{err}
		}
		return nil
	}
}

// group makes cmd a command that only holds subcommands: run with an
// unknown one, or without one (except plain "millrace", which prints the
// help), it is a usage error naming the subcommands.
func group(cmd *cobra.Command) *cobra.Command {
	cmd.Args = args(cobra.NoArgs)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if !cmd.HasParent() {
			return cmd.Help() // plain "millrace"
		}
		var names []string
		for _, c := range cmd.Commands() {
			if c.IsAvailableCommand() {
				names = append(names, c.Name())
			}
		}
		return usagef("%s needs a subcommand: %s", cmd.CommandPath(), strings.Join(names, ", "))
	}
	return cmd
}

// connect opens the pool on first use and checks the schema name.
func (a *app) connect(ctx context.Context) (*pgxpool.Pool, error) {
	if a.pool != nil {
		return a.pool, nil
	}
	if _, err := sqlident.Schema(a.schema); err != nil {
		return nil, usageError{fmt.Errorf("--schema: %w", err)}
	}
	url := a.databaseURL
	if url == "" {
		url = a.getenv("DATABASE_URL")
	}
	if url == "" {
		return nil, usagef("no database: set DATABASE_URL or --database-url")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, usageError{fmt.Errorf("database url: %w", err)}
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL at %s:%d (database %q) does not answer: %w",
			cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database, err)
	}
	a.pool = pool
	return pool, nil
}

// emit prints v as indented JSON with --json, else calls human.
func (a *app) emit(v any, human func(w io.Writer)) error {
	if a.collected != nil {
		*a.collected = append(*a.collected, schemaOutput{Schema: a.schema, Result: v, human: human})
		return nil
	}
	if a.json {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	human(a.stdout)
	return nil
}

// table writes rows aligned in columns.
func table(w io.Writer, header []string, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		for i := range r {
			r[i] = cell(r[i])
		}
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	tw.Flush()
}

// cell keeps a table cell on one line (tabs and newlines would break the
// alignment) and short.
func cell(s string) string {
	s = oneLine(s)
	if s == "" {
		return "-"
	}
	if r := []rune(s); len(r) > 60 {
		return string(r[:59]) + "…"
	}
	return s
}

// age prints a duration rounded for people: 3s, 4m12s, 2h5m, 3d4h.
func age(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	default:
		days := int(d / (24 * time.Hour))
		return fmt.Sprintf("%dd%dh", days, int((d%(24*time.Hour))/time.Hour))
	}
}

// explainMissingTables turns err, when it is PostgreSQL's "relation does
// not exist", into one that says which schema the command looked in and
// which schemas hold millrace tables.
func (a *app) explainMissingTables(ctx context.Context, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" { // undefined_table
		return err
	}
	const most = 10
	schemas, qerr := migrations.Schemas(ctx, a.pool)
	if qerr != nil {
		return err
	}
	where := "no schema holds them"
	if len(schemas) > 0 {
		shown := schemas[:min(len(schemas), most)]
		where = "the schemas that hold them: " + strings.Join(shown, ", ")
		if len(schemas) > most {
			where += fmt.Sprintf(" and %d more", len(schemas)-most)
		}
		where += "; pass --schema"
	} else {
		where += `; run "millrace migrate up" to create them`
	}
	return wrapped{msg: fmt.Sprintf("schema %q has no millrace tables (%s): %s", a.schema, pgErr.Message, where), err: err}
}

// wrapped is err with a message of its own.
type wrapped struct {
	msg string
	err error
}

func (w wrapped) Error() string { return w.msg }
func (w wrapped) Unwrap() error { return w.err }

// annotationSchemas marks a command that takes several schemas
// (Annotations[annotationSchemas] = "many"): a listing, run by eachSchema.
const annotationSchemas = "schemas"

// multiSchemaCommands are the commands marked so, for the usage error.
var multiSchemaCommands = []string{"saga list", "outbox stats", "migrate status", "console"}

// manySchemas marks cmd as taking several schemas.
func manySchemas(cmd *cobra.Command) *cobra.Command {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[annotationSchemas] = "many"
	return cmd
}

// listing makes cmd a listing over the schemas: marked as taking several,
// its RunE run once per schema by eachSchema.
func (a *app) listing(cmd *cobra.Command) *cobra.Command {
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		return a.eachSchema(c, func() error { return run(c, args) })
	}
	return manySchemas(cmd)
}

// schemas returns the schemas a listing covers: --schema (repeated), or
// with --all-schemas every schema holding millrace's tables.
func (a *app) schemas(ctx context.Context) ([]string, error) {
	if !a.allSchemas {
		return a.schemaList, nil
	}
	pool, err := a.connect(ctx)
	if err != nil {
		return nil, err
	}
	schemas, err := migrations.Schemas(ctx, pool)
	if err != nil {
		return nil, err
	}
	if len(schemas) == 0 {
		return nil, errors.New(`no schema holds millrace's tables; run "millrace migrate up"`)
	}
	return schemas, nil
}

// schemaOutput is one schema's result of a listing over several.
type schemaOutput struct {
	Schema string `json:"schema"`
	Result any    `json:"result,omitempty"`
	Error  string `json:"error,omitempty"`
	human  func(io.Writer)
}

// eachSchema runs a listing: once, as it is, for one schema named once;
// else once per schema, printing each schema's result under its name (as
// a JSON array of {"schema", "result"} or {"schema", "error"} with
// --json). A schema that fails does not stop the others; the command then
// fails after printing them all.
func (a *app) eachSchema(cmd *cobra.Command, run func() error) error {
	if !a.allSchemas && len(a.schemaList) == 1 {
		return run()
	}
	schemas, err := a.schemas(cmd.Context())
	if err != nil {
		return err
	}
	var out []schemaOutput
	failed := 0
	for _, s := range schemas {
		a.schema = s
		var got []schemaOutput
		a.collected = &got
		err := run()
		a.collected = nil
		switch {
		case err != nil:
			failed++
			out = append(out, schemaOutput{Schema: s, Error: err.Error()})
		case len(got) > 0:
			out = append(out, got...)
		}
	}
	a.schema = a.schemaList[0]
	if err := a.emit(out, func(w io.Writer) {
		for i, o := range out {
			if i > 0 {
				fmt.Fprintln(w)
			}
			fmt.Fprintf(w, "== schema %s\n", o.Schema)
			if o.Error != "" {
				fmt.Fprintf(w, "error: %s\n", o.Error)
			} else if o.human != nil {
				o.human(w)
			}
		}
	}); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d schemas failed", failed, len(schemas))
	}
	return nil
}
