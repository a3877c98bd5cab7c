package console

import (
	"context"
	"crypto/rand"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Config configures a Console.
type Config struct {
	// Schema holds millrace's tables. Defaults to "millrace".
	Schema string
	// Prefix is the path the console is mounted under, such as "/ops":
	// mount it with mux.Handle("/ops/", c) and it strips the prefix itself
	// and builds its links under it. Defaults to "" (the root).
	Prefix string
	// Authenticate says who is asking, from the request: the console
	// serves a request only when it returns an Identity with a Name (any
	// other gets 401 and changes nothing), records that name as the
	// operator of every action, and binds the forms' anti-CSRF tokens to
	// it. ProxyAuth (behind an authenticating proxy) and TokenAuth (a
	// bearer token or session the host checks) are ready-made. Required.
	Authenticate func(*http.Request) (Identity, error)
	// Authorize says whether an identity may take an action on a
	// resource: nil if it may, else an error saying why not, which the
	// console shows (403) before it changes anything. It is asked for
	// every page and every action, and for each button before it is
	// drawn. Defaults to ByRole (the viewer, operator and admin roles).
	Authorize func(ctx context.Context, who Identity, action Action, res Resource) error
	// Redact decides what of a payload who is shown (a saga's data, a
	// dead letter's body, a poisoned message's payload: res says which):
	// payload as it is, a copy with fields redacted, or nil to hide it.
	// What it returns is all that reaches the browser. Defaults to: the
	// payload as it is to an identity Authorize lets "read-payload" res,
	// else a JSON payload with every value replaced by "[redacted]" (its
	// keys kept), and any other payload hidden.
	Redact func(who Identity, res Resource, payload []byte) []byte
	// ReadOnly shows everything and changes nothing, whoever asks: no
	// action buttons, and every POST is refused with 403. Defaults to
	// false.
	ReadOnly bool
	// InboxConsumers are the inboxes whose dead letters the console shows.
	// Defaults to every consumer that has dead letters (found on the
	// dead-letter index, at most 100).
	InboxConsumers []string
	// PageSize is how many dead letters a page lists. Defaults to 50.
	PageSize int
	// CSRFKey signs the anti-CSRF tokens; at least 32 bytes. Give every
	// replica behind a load balancer the same key. Defaults to a random key
	// per process (tokens of pages served before a restart are refused:
	// reload the page).
	CSRFKey []byte
	// Sagas is the orchestrator the saga pages read and act through. An
	// operator action runs the saga's next step, which takes the saga's
	// definition: pass the service's own Orchestrator, with its definitions
	// registered: actions then act at once. Defaults to an Orchestrator on
	// Schema with none: the pages show every saga, and an action records an
	// operator request (saga.Orchestrator.Request), checked against the saga's state,
	// that the service's running orchestrator applies on its next timer
	// pass.
	Sagas *saga.Orchestrator
	// KafkaBrokers are the Kafka brokers the poison-topic page reads
	// poisoned messages from (and requeues them through), and the
	// consumer-lag page reads the consumer groups from. Defaults to none:
	// those pages say they cannot read them.
	KafkaBrokers []string
	// LagStallAfter is how old the oldest unconsumed record of a partition
	// may get before the consumer-lag page flags the partition stalled
	// (kafkalag.Config.StallAfter). Defaults to 1 minute.
	LagStallAfter time.Duration
	// PoisonTopics are poison topics the poison-topic page links to
	// (any other can be typed in). Defaults to none.
	PoisonTopics []string
	// Logger records every operator action (and failures, and refusals).
	// Defaults to slog.Default().
	Logger *slog.Logger
	// Metrics, when set, registers the audit trail's counter
	// (millrace_audit_actions_total: the operator actions this process
	// recorded, by source, kind, action and outcome). Defaults to none.
	Metrics prometheus.Registerer
	// Services makes this a console over several services, each with its
	// own millrace schema: the overview lists every service with its
	// counts, the navigation picks one, and each service's pages live
	// under Prefix + "/s/" + its Name. Schema, Sagas and InboxConsumers
	// are then set per Service and must be left empty here. Defaults to
	// none: one service, in Schema.
	Services []Service
	// DiscoverServices adds every schema that holds millrace's tables
	// (migrations.Schemas) as a Service named after its schema, looked
	// up again on each visit of the overview (a service migrated later
	// shows up without a restart). Schemas whose names are not valid
	// service names are left out. Defaults to false.
	DiscoverServices bool
}

// Service is one service of a console over several (Config.Services).
type Service struct {
	// Name names the service in the navigation and in its pages' paths:
	// letters, digits, '.', '-' and '_', at most 63. Required.
	Name string
	// Schema holds the service's millrace tables. Defaults to Name.
	Schema string
	// Sagas is the service's orchestrator, as Config.Sagas. Defaults to
	// an Orchestrator on Schema with no definitions (actions are recorded
	// as operator requests for the service's running orchestrator).
	Sagas *saga.Orchestrator
	// InboxConsumers are the service's inboxes, as Config.InboxConsumers.
	// Defaults to every consumer that has dead letters.
	InboxConsumers []string
}

// Console is the web console, an http.Handler. It is safe for concurrent
// use.
type Console struct {
	cfg    Config
	pool   *pgxpool.Pool
	schema string
	outbox *outbox.Admin
	sagas  *saga.Orchestrator
	// requests records operator requests when Config.Sagas was not given
	// (no definitions to act with); nil otherwise.
	requests *saga.Orchestrator
	// operator withdraws pending requests (whoever recorded them).
	operator *saga.Orchestrator
	// trail reads the audit trail, and records what no other package
	// does (a poison topic's requeue).
	trail   *audit.Trail
	csrf    *csrf
	log     *slog.Logger
	pages   map[string]*template.Template
	handler http.Handler
	// set is the console over several services this one belongs to (or,
	// with service "", is the top of); nil for a single-service console.
	set     *serviceSet
	service string
	// bulkInRequest is bulkInRequest, but for tests.
	bulkInRequest int64

	consumersSQL, consumerDeadSQL, sagaCountSQL, sagaChartSQL string
}

// New returns a Console on pool. It does not touch the database.
func New(pool *pgxpool.Pool, cfg Config) (*Console, error) {
	if len(cfg.Services) > 0 || cfg.DiscoverServices {
		return newServices(pool, cfg)
	}
	return newSingle(pool, cfg)
}

// withDefaults checks cfg and fills in its defaults.
func withDefaults(pool *pgxpool.Pool, cfg Config) (Config, error) {
	fail := func(format string, args ...any) (Config, error) {
		return cfg, fmt.Errorf("%w: console: "+format, append([]any{core.ErrConfig}, args...)...)
	}
	if pool == nil {
		return fail("New needs a pool")
	}
	if cfg.Authenticate == nil {
		return fail("Config.Authenticate is required: say who is asking (ProxyAuth behind your authenticating proxy, TokenAuth with your token or session check, or your own)")
	}
	cfg.Prefix = strings.TrimSuffix(cfg.Prefix, "/")
	if cfg.Prefix != "" && (!strings.HasPrefix(cfg.Prefix, "/") || strings.ContainsAny(cfg.Prefix, "?#{}")) {
		return fail("Prefix %q must be a path starting with /", cfg.Prefix)
	}
	if cfg.PageSize < 0 || cfg.PageSize > 1000 {
		return fail("PageSize must be in 1..1000, got %d", cfg.PageSize)
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = 50
	}
	if cfg.LagStallAfter < 0 {
		return fail("LagStallAfter must not be negative")
	}
	if cfg.LagStallAfter == 0 {
		cfg.LagStallAfter = time.Minute
	}
	if cfg.Authorize == nil {
		cfg.Authorize = ByRole
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CSRFKey == nil {
		cfg.CSRFKey = make([]byte, 32)
		if _, err := rand.Read(cfg.CSRFKey); err != nil {
			return cfg, err
		}
	} else if len(cfg.CSRFKey) < 32 {
		return fail("CSRFKey must be at least 32 bytes")
	}
	for _, name := range cfg.InboxConsumers {
		if name == "" {
			return fail("InboxConsumers has an empty name")
		}
	}
	if err := audit.Register(cfg.Metrics); err != nil {
		return fail("Metrics: %v", err)
	}
	return cfg, nil
}

// newSingle returns the console of one schema.
func newSingle(pool *pgxpool.Pool, cfg Config) (*Console, error) {
	cfg, err := withDefaults(pool, cfg)
	if err != nil {
		return nil, err
	}
	schema, err := sqlident.Schema(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("%w: console: %v", core.ErrConfig, err)
	}
	admin, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema})
	if err != nil {
		return nil, fmt.Errorf("%w: console: %v", core.ErrConfig, err)
	}
	var requests *saga.Orchestrator
	operator, err := saga.New(pool, saga.Config{Schema: schema})
	if err != nil {
		return nil, fmt.Errorf("%w: console: %v", core.ErrConfig, err)
	}
	if cfg.Sagas == nil {
		if cfg.Sagas, err = saga.New(pool, saga.Config{Schema: schema}); err != nil {
			return nil, fmt.Errorf("%w: console: %v", core.ErrConfig, err)
		}
		requests = operator
	}
	c := &Console{
		cfg:           cfg,
		pool:          pool,
		schema:        schema,
		outbox:        admin,
		sagas:         cfg.Sagas,
		requests:      requests,
		operator:      operator,
		trail:         audit.New(schema),
		csrf:          &csrf{key: cfg.CSRFKey, path: cfg.Prefix + "/"},
		bulkInRequest: bulkInRequest,
		log:           cfg.Logger.With("component", "console", "schema", schema),
	}
	c.statements()
	if err := c.parseTemplates(); err != nil {
		return nil, err
	}
	c.handler = c.routes()
	return c, nil
}

// statements builds the console's own queries on its schema.
func (c *Console) statements() {
	inboxTable := sqlident.Table(c.schema, "inbox_event")
	// The consumers that have dead letters, by a skip scan over
	// inbox_event_dead_idx (consumer, id) WHERE dead_at IS NOT NULL AND NOT
	// processed: one index probe per consumer, however many rows there are.
	c.consumersSQL = fmt.Sprintf(`WITH RECURSIVE c(consumer) AS (
    (SELECT consumer FROM %[1]s WHERE dead_at IS NOT NULL AND NOT processed ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT (SELECT e.consumer FROM %[1]s e
             WHERE e.dead_at IS NOT NULL AND NOT e.processed AND e.consumer > c.consumer
             ORDER BY e.consumer LIMIT 1)
      FROM c WHERE c.consumer IS NOT NULL
)
SELECT consumer FROM c WHERE consumer IS NOT NULL LIMIT 100`, inboxTable)
	// A consumer's dead letters, counted on the same index up to a cap.
	c.consumerDeadSQL = fmt.Sprintf(`SELECT count(*) FROM (
    SELECT 1 FROM %s WHERE consumer = $1 AND dead_at IS NOT NULL AND NOT processed LIMIT $2) s`, inboxTable)

	// Sagas in a status, counted on saga_instance_status_idx up to a cap.
	c.sagaCountSQL = fmt.Sprintf(`SELECT count(*) FROM (
    SELECT 1 FROM %s WHERE status = $1 LIMIT $2) s`, sqlident.Table(c.schema, "saga_instance"))

	// Sagas started, completed, compensated and stuck per minute since $1,
	// for the overview's charts: a range scan on saga_history_outcome_at_idx
	// (at) WHERE event IN (the same four), of migration 008, which holds
	// only those lines (a few per saga), not the whole history.
	c.sagaChartSQL = fmt.Sprintf(`SELECT date_trunc('minute', at) AS minute, event, count(*)
  FROM %s
 WHERE event IN ('started', 'completed', 'compensated', 'stuck') AND at >= $1
 GROUP BY 1, 2`, sqlident.Table(c.schema, "saga_history"))
}

// ServeHTTP serves the console.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) { c.handler.ServeHTTP(w, r) }

func (c *Console) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", c.overview)
	mux.HandleFunc("GET /outbox/dead", c.outboxDead)
	mux.HandleFunc("GET /outbox/dead/{action}", c.outboxConfirm)
	mux.HandleFunc("POST /outbox/dead/{action}", c.post(c.outboxAct))
	mux.HandleFunc("GET /outbox/dead/bulk/{action}", c.bulkConfirm("outbox"))
	mux.HandleFunc("POST /outbox/dead/bulk/{action}", c.post(c.bulkPost("outbox")))
	mux.HandleFunc("GET /inbox/dead", c.inboxDead)
	mux.HandleFunc("GET /inbox/dead/{action}", c.inboxConfirm)
	mux.HandleFunc("POST /inbox/dead/{action}", c.post(c.inboxAct))
	mux.HandleFunc("GET /inbox/dead/bulk/{action}", c.bulkConfirm("inbox"))
	mux.HandleFunc("POST /inbox/dead/bulk/{action}", c.post(c.bulkPost("inbox")))
	mux.HandleFunc("GET /sagas", c.sagaList)
	mux.HandleFunc("GET /saga", c.sagaPage)
	mux.HandleFunc("POST /sagas/bulk", c.post(c.sagaBulkPlan))
	mux.HandleFunc("GET /sagas/bulk", c.sagaBulkPage)
	mux.HandleFunc("POST /sagas/bulk/apply", c.post(c.sagaBulkApply))
	mux.HandleFunc("GET /saga/{action}", c.sagaConfirm)
	mux.HandleFunc("POST /saga/{action}", c.post(c.sagaAct))
	mux.HandleFunc("GET /poison", c.poisonPage)
	mux.HandleFunc("POST /poison/requeue", c.post(c.poisonRequeue))
	mux.HandleFunc("GET /poison/bulk", c.bulkConfirm("poison"))
	mux.HandleFunc("POST /poison/bulk", c.post(c.bulkPost("poison")))
	mux.HandleFunc("GET /kafka/lag", c.lagPage)
	mux.HandleFunc("GET /audit", c.auditPage)
	static, _ := fs.Sub(staticFS, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, http.StatusNotFound, "No such page.")
	})

	var h http.Handler = mux
	// Browsers' Sec-Fetch-Site and Origin headers turn away cross-origin
	// POSTs before the token is even looked at: defence in depth.
	h = http.NewCrossOriginProtection().Handler(h)
	h = c.authenticate("/static/", h)
	h = securityHeaders(h)
	if c.cfg.Prefix != "" {
		h = http.StripPrefix(c.cfg.Prefix, h)
	}
	return h
}

func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// post guards an action: read-only mode, then the CSRF token (bound to
// the identity), then the form; act authorizes and does the work and
// returns where to go next.
func (c *Console) post(act func(w http.ResponseWriter, r *http.Request) (redirect string, ok bool)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if c.cfg.ReadOnly {
			c.fail(w, r, http.StatusForbidden, "The console is read-only: nothing was changed.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if err := r.ParseForm(); err != nil {
			c.fail(w, r, http.StatusBadRequest, "Bad form: "+err.Error())
			return
		}
		if who := identity(r).Name; !c.csrf.valid(r, who) {
			c.log.Warn("console: action refused: missing or invalid CSRF token", "operator", who, "path", r.URL.Path)
			c.fail(w, r, http.StatusForbidden, "Missing or invalid CSRF token: nothing was changed. Reload the page and try again.")
			return
		}
		if to, ok := act(w, r); ok {
			http.Redirect(w, r, c.cfg.Prefix+to, http.StatusSeeOther)
		}
	}
}

// actor is who acts for r, and why: its identity, from where, reason.
func actor(r *http.Request, reason string) core.Actor {
	return core.Actor{Operator: identity(r).Name, Reason: reason, From: from(r)}
}

// context for database calls of one request.
func reqCtx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), 30*time.Second)
}
