package cli

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/millrace/millrace/migrations"
)

func (a *app) migrateCmd() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "migrate",
		Short: "Apply, revert, inspect and validate the schema's migrations",
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "up",
		Short: "Apply every migration not yet applied, in one transaction",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := a.migrator(cmd)
			if err != nil {
				return err
			}
			res, err := m.Up(cmd.Context())
			if err != nil {
				return err
			}
			return a.emitResult(m.Schema(), "applied", res)
		},
	})

	var to int
	down := &cobra.Command{
		Use:   "down",
		Short: "Revert migrations above --to (default: the newest one only), in one transaction",
		Long: "Revert applied migrations above version --to, newest first, in one transaction.\n" +
			"Without --to only the newest applied migration is reverted. --to 0 removes all of millrace's tables.",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := a.migrator(cmd)
			if err != nil {
				return err
			}
			target := to
			if !cmd.Flags().Changed("to") {
				current, err := m.Version(cmd.Context())
				if err != nil {
					return err
				}
				if current == 0 {
					return fmt.Errorf("schema %q has no migration applied: nothing to revert", m.Schema())
				}
				target = current - 1
			} else if to < 0 || to > migrations.Latest() {
				return usagef("--to %d: known versions are 0..%d", to, migrations.Latest())
			}
			res, err := m.Down(cmd.Context(), target)
			if err != nil {
				return err
			}
			return a.emitResult(m.Schema(), "reverted", res)
		},
	}
	down.Flags().IntVar(&to, "to", 0, "version to revert to (0: remove everything)")
	cmd.AddCommand(down)

	cmd.AddCommand(a.listing(&cobra.Command{
		Use:   "status",
		Short: "Show which migrations are applied",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := a.migrator(cmd)
			if err != nil {
				return err
			}
			st, err := status(cmd, m)
			if err != nil {
				return err
			}
			return a.emit(st, func(w io.Writer) {
				fmt.Fprintf(w, "schema %s: version %d, latest known %d\n\n", st.Schema, st.Version, st.Latest)
				rows := make([][]string, 0, len(st.Migrations))
				for _, mig := range st.Migrations {
					rows = append(rows, []string{strconv.Itoa(mig.Version), mig.Name, mig.State})
				}
				table(w, []string{"VERSION", "NAME", "STATE"}, rows)
			})
		},
	}))

	cmd.AddCommand(&cobra.Command{
		Use:   "validate",
		Short: "Exit 0 when every known migration is applied unchanged and nothing newer is, else 1",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := a.migrator(cmd)
			if err != nil {
				return err
			}
			if err := m.Validate(cmd.Context()); err != nil {
				return err
			}
			return a.emit(map[string]any{"schema": m.Schema(), "valid": true, "version": migrations.Latest()}, func(w io.Writer) {
				fmt.Fprintf(w, "schema %s is valid at version %d\n", m.Schema(), migrations.Latest())
			})
		},
	})
	return cmd
}

func (a *app) migrator(cmd *cobra.Command) (*migrations.Migrator, error) {
	pool, err := a.connect(cmd.Context())
	if err != nil {
		return nil, err
	}
	m, err := migrations.New(pool, migrations.Config{Schema: a.schema})
	if err != nil {
		return nil, usageError{fmt.Errorf("--schema: %w", err)}
	}
	return m, nil
}

type migrateResult struct {
	Schema  string `json:"schema"`
	From    int    `json:"from"`
	To      int    `json:"to"`
	Applied []int  `json:"applied"` // versions applied (up) or reverted (down), in the order run
}

func (a *app) emitResult(schema, verb string, res *migrations.Result) error {
	out := migrateResult{Schema: schema, From: res.From, To: res.To, Applied: res.Applied}
	if out.Applied == nil {
		out.Applied = []int{}
	}
	return a.emit(out, func(w io.Writer) {
		if len(res.Applied) == 0 {
			fmt.Fprintf(w, "schema %s: nothing to do, at version %d\n", schema, res.To)
			return
		}
		fmt.Fprintf(w, "schema %s: %s %v, version %d -> %d\n", schema, verb, res.Applied, res.From, res.To)
	})
}

type migrationState struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	State   string `json:"state"` // applied, pending, changed (applied with another script), unknown (newer than this millrace)
}

type migrateStatus struct {
	Schema     string           `json:"schema"`
	Version    int              `json:"version"` // highest applied
	Latest     int              `json:"latest"`  // highest this millrace knows
	Migrations []migrationState `json:"migrations"`
}

func status(cmd *cobra.Command, m *migrations.Migrator) (*migrateStatus, error) {
	ctx := cmd.Context()
	version, err := m.Version(ctx)
	if err != nil {
		return nil, err
	}
	st := &migrateStatus{Schema: m.Schema(), Version: version, Latest: migrations.Latest()}
	var verr *migrations.ValidationError
	if err := m.Validate(ctx); err != nil && !errors.As(err, &verr) {
		return nil, err
	}
	for _, mig := range migrations.All() {
		state := "applied"
		switch {
		case verr != nil && slices.Contains(verr.Pending, mig.Version):
			state = "pending"
		case verr != nil && slices.Contains(verr.Changed, mig.Version):
			state = "changed"
		}
		st.Migrations = append(st.Migrations, migrationState{Version: mig.Version, Name: mig.Name, State: state})
	}
	if verr != nil {
		for _, v := range verr.Unknown {
			st.Migrations = append(st.Migrations, migrationState{Version: v, Name: "?", State: "unknown"})
		}
	}
	return st, nil
}
