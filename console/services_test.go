package console_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/outbox"
)

// serveServices serves a console over several services at /ops.
func serveServices(t *testing.T, db *pgtest.DB, cfg console.Config) *bundle {
	t.Helper()
	b := &bundle{t: t, db: db, logs: &syncBuffer{}, prefix: "/ops"}
	cfg.Prefix = "/ops"
	cfg.Logger = slog.New(slog.NewTextHandler(b.logs, nil))
	if cfg.Authenticate == nil {
		cfg.Authenticate = console.ProxyAuth("", "", loopback...)
	}
	c, err := console.New(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/", c)
	b.srv = httptest.NewServer(mux)
	t.Cleanup(b.srv.Close)
	b.client = b.newClient()
	return b
}

// One console over two services' schemas: the overview counts each
// service's sagas and dead letters; the navigation picks a service; each
// service's pages read and act on its own schema only.
func TestConsoleOverTwoServices(t *testing.T) {
	t.Parallel()
	payments, orders := pgtest.New(t), pgtest.New(t)
	s := opstest.NewSagas(t, payments)
	s.StuckRefund(t, "refund-1")
	dead := opstest.OutboxDead(t, orders, "orders", 2)
	b := serveServices(t, payments, console.Config{Services: []console.Service{
		{Name: "payments", Schema: payments.Schema, Sagas: s.O},
		{Name: "orders", Schema: orders.Schema},
	}})

	r := b.get("/")
	if r.status != http.StatusOK {
		t.Fatalf("GET /ops/: %d\n%s", r.status, r.body)
	}
	contains(t, "services overview", r.body,
		`<tr data-service="payments">`, `<a href="/ops/s/payments/">payments</a>`,
		`data-field="sagas-stuck"><a href="/ops/s/payments/sagas?status=stuck">1</a>`,
		`<tr data-service="orders">`, `data-field="outbox-dead"><a href="/ops/s/orders/outbox/dead">2</a>`,
		`<a href="/ops/" class="active" aria-current="page">All services</a>`)
	if strings.Index(r.body, `data-service="payments"`) > strings.Index(r.body, `data-service="orders"`) {
		t.Error("services not in the configured order")
	}

	r = b.get("/s/payments/sagas?status=stuck")
	contains(t, "payments' stuck sagas", r.body, `data-saga-id="refund-1"`,
		`<a href="/ops/s/payments/" class="active" aria-current="page" data-service="payments">payments</a>`,
		`<a href="/ops/s/orders/" data-service="orders">orders</a>`, `href="/ops/s/payments/static/console.css"`)
	r = b.get("/s/orders/sagas?status=stuck")
	if strings.Contains(r.body, "refund-1") {
		t.Error("the orders service lists the payments service's saga")
	}
	contains(t, "orders' dead letters", b.get("/s/orders/outbox/dead").body, dead[0], dead[1])
	if body := b.get("/s/payments/outbox/dead").body; strings.Contains(body, dead[0]) {
		t.Error("the payments service lists the orders service's dead letters")
	}

	// An action in one service acts on its schema.
	token := b.confirm("/s/orders/outbox/dead/requeue?id=" + dead[0])
	r = b.post("/s/orders/outbox/dead/requeue", url.Values{"csrf_token": {token}, "id": {dead[0]}, "reason": {"fixed"}})
	if r.status != http.StatusSeeOther || r.location != "/ops/s/orders/outbox/dead?kind=outbox&done=requeue&n=1" {
		t.Fatalf("POST requeue: %d to %q\n%s", r.status, r.location, r.body)
	}
	admin, err := outbox.NewAdmin(orders.Pool, outbox.AdminConfig{Schema: orders.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := admin.Stats(t.Context()); err != nil || st.Dead != 1 || st.Pending != 1 {
		t.Fatalf("orders after requeue: %+v, %v; want 1 dead, 1 pending", st, err)
	}

	if r := b.get("/s/nope/"); r.status != http.StatusNotFound || !strings.Contains(r.body, "No such service.") {
		t.Errorf("unknown service: %d\n%s", r.status, r.body)
	}
	if r := b.get("/s/orders"); r.status != http.StatusFound || r.location != "/ops/s/orders/" {
		t.Errorf("service without its slash: %d to %q", r.status, r.location)
	}
	if r := b.get("/static/console.css"); r.status != http.StatusOK {
		t.Errorf("static at the top: %d", r.status)
	}
}

// DiscoverServices finds every schema holding millrace's tables, also one
// migrated after the console started.
func TestConsoleDiscoversServices(t *testing.T) {
	t.Parallel()
	first := pgtest.New(t)
	b := serveServices(t, first, console.Config{DiscoverServices: true})
	contains(t, "discovered", b.get("/").body, `<tr data-service="`+first.Schema+`">`)
	later := pgtest.New(t)
	opstest.OutboxDead(t, later, "orders", 1)
	contains(t, "discovered later", b.get("/s/"+later.Schema+"/outbox/dead").body, `<h1>Outbox dead letters</h1>`)
	contains(t, "listed later", b.get("/").body, `<tr data-service="`+later.Schema+`">`)
}

func TestServicesConfigRefused(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for name, cfg := range map[string]console.Config{
		"schema beside services": {Schema: "x", Services: []console.Service{{Name: "a"}}},
		"bad name":               {Services: []console.Service{{Name: "a/b"}}},
		"empty name":             {Services: []console.Service{{}}},
		"duplicate":              {Services: []console.Service{{Name: "a"}, {Name: "a", Schema: "b"}}},
		"bad schema":             {Services: []console.Service{{Name: "a", Schema: `x"y`}}},
	} {
		cfg.Authenticate = console.ProxyAuth("", "", loopback...)
		if _, err := console.New(db.Pool, cfg); !errors.Is(err, core.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
}

// Authorize decides per service: an identity the authorizer keeps out of
// one service does not see it listed on the overview, and its pages and
// actions are refused, while the other service's are served.
func TestAuthorizePerService(t *testing.T) {
	t.Parallel()
	payments, orders := pgtest.New(t), pgtest.New(t)
	dead := opstest.OutboxDead(t, orders, "orders", 1)
	opstest.OutboxDead(t, payments, "payments", 1)
	b := serveServices(t, payments, console.Config{
		Services: []console.Service{{Name: "payments", Schema: payments.Schema}, {Name: "orders", Schema: orders.Schema}},
		Authorize: func(ctx context.Context, who console.Identity, action console.Action, res console.Resource) error {
			if res.Service == "orders" {
				return errors.New("orders is the orders team's")
			}
			return console.ByRole(ctx, who, action, res)
		},
	})
	r := b.get("/")
	if !strings.Contains(r.body, `<tr data-service="payments">`) || strings.Contains(r.body, `<tr data-service="orders">`) {
		t.Errorf("the overview lists a service the identity may not see:\n%s", r.body)
	}
	if r := b.get("/s/orders/outbox/dead"); r.status != http.StatusForbidden || strings.Contains(r.body, dead[0]) ||
		!strings.Contains(r.body, "orders is the orders team&#39;s") {
		t.Errorf("the orders service's page: %d\n%s", r.status, r.body)
	}
	if r := b.get("/s/payments/outbox/dead"); r.status != http.StatusOK {
		t.Errorf("the payments service's page: %d", r.status)
	}
}
