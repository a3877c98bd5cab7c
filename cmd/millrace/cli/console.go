package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/millrace/millrace/console"
)

func (a *app) consoleCmd() *cobra.Command {
	var (
		listen, prefix, userHeader, rolesHeader, operator string
		readOnly                                          bool
		consumers, poisonTopics, proxies                  []string
		brokers                                           string
	)
	cmd := manySchemas(&cobra.Command{
		Use:   "console",
		Short: "Serve the web console",
		Long: "Serve the web console (package console) until interrupted: the outbox backlog, and the outbox's\n" +
			"and inboxes' dead letters with requeue and discard, and the sagas with their operator actions (recorded\n" +
			"as requests for the service's running orchestrator, unless this millrace has the saga definitions:\n" +
			"then they act at once). Every action is recorded in the audit trail with who and why.\n" +
			"Who is asking: behind your authenticating proxy, --trusted-proxy names the proxy's addresses, whose\n" +
			"--user-header and --roles-header (viewer, operator, admin) are believed; a request from any other\n" +
			"address is refused. Without --trusted-proxy, only requests from this host are served, as --operator\n" +
			"(default $USER) with the admin role.\n" +
			"With --schema given several times, or --all-schemas, it is one console over several services: an\n" +
			"overview of them all, and each service's pages under /s/<schema>/.",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			if brokers == "" {
				brokers = a.getenv("KAFKA_BROKERS")
			}
			cfg := console.Config{
				Schema: a.schema, Prefix: prefix, ReadOnly: readOnly, InboxConsumers: consumers,
				KafkaBrokers: splitList(brokers), PoisonTopics: poisonTopics,
				Logger:    slog.New(slog.NewTextHandler(a.stderr, nil)),
				Authorize: a.authz, Redact: a.redactFn,
			}
			if cfg.Authenticate, err = a.consoleIdentity(proxies, userHeader, rolesHeader, operator); err != nil {
				return err
			}
			if a.register != nil {
				// Built with the saga definitions: saga actions act at once.
				if cfg.Sagas, err = a.orchestrator(ctx); err != nil {
					return err
				}
			}
			// Several services: --schema repeated, or every schema that
			// holds millrace's tables.
			if a.allSchemas || len(a.schemaList) > 1 {
				cfg.Schema, cfg.Sagas, cfg.InboxConsumers = "", nil, nil
				cfg.DiscoverServices = a.allSchemas
				if !a.allSchemas {
					for _, s := range a.schemaList {
						svc := console.Service{Name: s, Schema: s, InboxConsumers: consumers}
						if a.register != nil {
							a.schema = s
							if svc.Sagas, err = a.orchestrator(ctx); err != nil {
								return err
							}
						}
						cfg.Services = append(cfg.Services, svc)
					}
					a.schema = a.schemaList[0]
				}
			}
			c, err := console.New(pool, cfg)
			if err != nil {
				return usageError{err}
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			mux := http.NewServeMux()
			if p := strings.TrimSuffix(prefix, "/"); p != "" {
				mux.Handle(p+"/", c)
				mux.Handle("/{$}", http.RedirectHandler(p+"/", http.StatusFound))
			} else {
				mux.Handle("/", c)
			}
			srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
			mode := ""
			if readOnly {
				mode = " (read-only)"
			}
			fmt.Fprintf(a.stderr, "millrace console%s listening on http://%s%s/\n", mode, ln.Addr(), strings.TrimSuffix(prefix, "/"))
			errc := make(chan error, 1)
			go func() { errc <- srv.Serve(ln) }()
			select {
			case err := <-errc:
				return err
			case <-ctx.Done():
			}
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil {
				return err
			}
			if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	})
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:8080", "address to listen on (\":8080\" for every interface)")
	f.StringVar(&prefix, "prefix", "", "serve under this path, e.g. /ops")
	f.BoolVar(&readOnly, "read-only", false, "show everything, change nothing (no action buttons; POSTs refused)")
	f.StringSliceVar(&proxies, "trusted-proxy", nil, "address (or CIDR) of your authenticating proxy, whose identity headers are believed (repeatable)")
	f.StringVar(&userHeader, "user-header", "X-Forwarded-User", "with --trusted-proxy: the header naming the user")
	f.StringVar(&userHeader, "operator-header", "X-Forwarded-User", "the same as --user-header")
	_ = f.MarkDeprecated("operator-header", "use --user-header (and --trusted-proxy)")
	f.StringVar(&rolesHeader, "roles-header", "X-Forwarded-Groups", "with --trusted-proxy: the header listing the user's roles, comma-separated")
	f.StringVar(&operator, "operator", "", "without --trusted-proxy: who acts from this host (default $USER)")
	f.StringSliceVar(&consumers, "consumers", nil, "inbox consumers to show (default: those with dead letters)")
	f.StringVar(&brokers, "brokers", "", "Kafka broker addresses, comma-separated, for the poison-topic page (default $KAFKA_BROKERS)")
	f.StringSliceVar(&poisonTopics, "poison-topics", nil, "poison topics the poison-topic page links to")
	return cmd
}

// consoleIdentity is how the console tells who is asking: behind the
// trusted proxies, their headers (console.ProxyAuth); without any, a
// request from this host is operator (default $USER), an admin, and any
// other has no identity.
func (a *app) consoleIdentity(proxies []string, userHeader, rolesHeader, operator string) (func(*http.Request) (console.Identity, error), error) {
	if len(proxies) > 0 {
		var prefixes []netip.Prefix
		for _, p := range proxies {
			prefix, err := netip.ParsePrefix(p)
			if err != nil {
				addr, aerr := netip.ParseAddr(p)
				if aerr != nil {
					return nil, usagef("--trusted-proxy %q: want an address or a CIDR", p)
				}
				prefix = netip.PrefixFrom(addr, addr.BitLen())
			}
			prefixes = append(prefixes, prefix)
		}
		return console.ProxyAuth(userHeader, rolesHeader, prefixes...), nil
	}
	if operator == "" {
		operator = a.getenv("USER")
	}
	if strings.TrimSpace(operator) == "" {
		return nil, usagef("--operator is required when $USER is not set (or serve behind a proxy: --trusted-proxy)")
	}
	return func(r *http.Request) (console.Identity, error) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if addr, perr := netip.ParseAddr(host); err != nil || perr != nil || !addr.Unmap().IsLoopback() {
			return console.Identity{}, fmt.Errorf("%s is not this host, and this console serves only this host (pass --trusted-proxy to serve behind a proxy)", r.RemoteAddr)
		}
		return console.Identity{Name: operator, Roles: []string{"admin"}}, nil
	}, nil
}

func loggingTopic() *cobra.Command {
	return &cobra.Command{
		Use:   "logging",
		Short: "How to route millrace's logs through log/slog, and the fields they carry",
		Long:  loggingHelp,
	}
}

const loggingHelp = `Logging

millrace's parts (outbox.Relay, inbox.Processor, saga.Orchestrator,
compensation.Participant, kafka.Publisher, millrace.Service and the retention it runs) log through Watermill's watermill.LoggerAdapter, given in their Config's Logger
field. One default everywhere (outbox.DefaultLogger): errors and warnings go to slog.Default(),
routine lines are logged at slog's Debug level and so are not shown. To log elsewhere, or more,
wrap your *slog.Logger with Watermill's adapter; watermill.NopLogger{} silences a part:

    logger := watermill.NewSlogLogger(slog.Default())
    relay, err := outbox.NewRelay(pool, outbox.RelayConfig{Publisher: pub, Logger: logger})

watermill.NewSlogLoggerWithLevelMapping changes which slog level each Watermill level maps to
(Watermill's Trace and Debug are both below slog's Info). The console takes a *slog.Logger
directly (console.Config.Logger) and logs every operator action on it.

Fields, the same name for the same thing everywhere (use them in your own handlers' logs too,
so one query finds an event's whole story):

    event_id       the event's UUID (outbox event id = Watermill message UUID = inbox dedup key)
    topic          the topic the event is published to
    partition_key  the key that orders events (the Kafka record key)
    saga_id        the saga instance (the saga package)
    consumer       the inbox's consumer name
    component      which part logged: outbox.Relay, inbox.Processor, console, ...
    schema         the PostgreSQL schema of millrace's tables
    operator       who did an operator action (console, and later the saga commands)
    attempt        the attempt number of a failing event or message
`
