package console

import (
	"context"
	"fmt"
	"io/fs"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/migrations"
)

// serviceName is what a Service.Name may be: it is a path segment.
var serviceName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// serviceSet is a console over several services: one single-schema
// Console per service, under prefix + "/s/" + its name, and the overview
// of them all at prefix + "/".
type serviceSet struct {
	cfg    Config // the shared settings, defaults applied
	pool   *pgxpool.Pool
	prefix string
	top    *Console // renders the overview and the errors of the top level
	static http.Handler

	mu       sync.Mutex
	names    []string            // in order: configured, then discovered by name
	byName   map[string]*Console // guarded by mu
	bySchema map[string]bool     // guarded by mu
}

type serviceLink struct {
	Name, Path string
	Active     bool
}

func newServices(pool *pgxpool.Pool, cfg Config) (*Console, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: console: New needs a pool", core.ErrConfig)
	}
	if cfg.Schema != "" || cfg.Sagas != nil || cfg.InboxConsumers != nil {
		return nil, fmt.Errorf("%w: console: with Services or DiscoverServices, set Schema, Sagas and InboxConsumers per Service", core.ErrConfig)
	}
	// Resolve the shared defaults once, so that every service's console
	// signs with the same CSRF key.
	top, err := newSingle(pool, cfg)
	if err != nil {
		return nil, err
	}
	cfg = top.cfg
	s := &serviceSet{cfg: cfg, pool: pool, prefix: cfg.Prefix, top: top,
		byName: map[string]*Console{}, bySchema: map[string]bool{}}
	for _, svc := range cfg.Services {
		if err := s.add(svc); err != nil {
			return nil, err
		}
	}
	static, _ := fs.Sub(staticFS, "static")
	s.static = http.StripPrefix(s.prefix+"/static/", http.FileServerFS(static))
	top.set, top.service = s, ""
	top.handler = securityHeaders(top.authenticate(s.prefix+"/static/", http.HandlerFunc(s.serve)))
	return top, nil
}

// add builds svc's console. Called with mu held, or before s is shared.
func (s *serviceSet) add(svc Service) error {
	if !serviceName.MatchString(svc.Name) {
		return fmt.Errorf("%w: console: service name %q: use letters, digits, '.', '-' and '_' (at most 63)", core.ErrConfig, svc.Name)
	}
	if _, dup := s.byName[svc.Name]; dup {
		return fmt.Errorf("%w: console: two services named %q", core.ErrConfig, svc.Name)
	}
	if svc.Schema == "" {
		svc.Schema = svc.Name
	}
	schema, err := sqlident.Schema(svc.Schema)
	if err != nil {
		return fmt.Errorf("%w: console: service %s: %v", core.ErrConfig, svc.Name, err)
	}
	cfg := s.cfg
	cfg.Services, cfg.DiscoverServices = nil, false
	cfg.Schema, cfg.Sagas, cfg.InboxConsumers = schema, svc.Sagas, svc.InboxConsumers
	cfg.Prefix = s.prefix + "/s/" + svc.Name
	c, err := newSingle(s.pool, cfg)
	if err != nil {
		return fmt.Errorf("console: service %s: %w", svc.Name, err)
	}
	c.set, c.service = s, svc.Name
	s.byName[svc.Name] = c
	s.bySchema[schema] = true
	s.names = append(s.names, svc.Name)
	return nil
}

// discover adds the schemas holding millrace's tables that no service has
// yet, when the console discovers services.
func (s *serviceSet) discover(ctx context.Context) error {
	if !s.cfg.DiscoverServices {
		return nil
	}
	schemas, err := migrations.Schemas(ctx, s.pool)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	first := len(s.names)
	for _, schema := range schemas {
		if s.bySchema[schema] || !serviceName.MatchString(schema) {
			continue
		}
		if _, taken := s.byName[schema]; taken {
			continue
		}
		if err := s.add(Service{Name: schema}); err != nil {
			return err
		}
	}
	slices.Sort(s.names[first:])
	return nil
}

func (s *serviceSet) get(name string) *Console {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byName[name]
}

func (s *serviceSet) list() []*Console {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Console, len(s.names))
	for i, n := range s.names {
		out[i] = s.byName[n]
	}
	return out
}

// links are the navigation's entries, active's marked.
func (s *serviceSet) links(active string) []serviceLink {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]serviceLink, len(s.names))
	for i, n := range s.names {
		out[i] = serviceLink{Name: n, Path: s.prefix + "/s/" + n + "/", Active: n == active}
	}
	return out
}

func (s *serviceSet) serve(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, s.prefix)
	switch {
	case !ok:
		s.top.fail(w, r, http.StatusNotFound, "No such page.")
	case rest == "":
		http.Redirect(w, r, s.prefix+"/", http.StatusFound)
	case rest == "/":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			s.top.fail(w, r, http.StatusMethodNotAllowed, "The overview of the services only shows.")
			return
		}
		s.overview(w, r)
	case strings.HasPrefix(rest, "/static/"):
		s.static.ServeHTTP(w, r)
	case strings.HasPrefix(rest, "/s/"):
		name, sub, _ := strings.Cut(rest[len("/s/"):], "/")
		c := s.get(name)
		if c == nil && s.cfg.DiscoverServices {
			if !s.discovered(w, r) {
				return
			}
			c = s.get(name)
		}
		switch {
		case c == nil:
			s.top.fail(w, r, http.StatusNotFound, "No such service.")
		case sub == "" && !strings.HasSuffix(rest, "/"):
			http.Redirect(w, r, s.prefix+"/s/"+name+"/", http.StatusFound)
		default:
			c.ServeHTTP(w, r)
		}
	default:
		s.top.fail(w, r, http.StatusNotFound, "No such page.")
	}
}

// serviceRow is a service's line on the services' overview.
type serviceRow struct {
	Name, Path string
	overviewData
	InboxDead     int64
	InboxDeadMore bool
	Error         string
}

// discovered runs discover for request r; when it fails it shows the
// error and reports false.
func (s *serviceSet) discovered(w http.ResponseWriter, r *http.Request) bool {
	ctx, cancel := reqCtx(r)
	defer cancel()
	if err := s.discover(ctx); err != nil {
		s.top.dbFail(w, r, err)
		return false
	}
	return true
}

func (s *serviceSet) overview(w http.ResponseWriter, r *http.Request) {
	if !s.top.allow(w, r, "read", Resource{Kind: "overview"}) || !s.discovered(w, r) {
		return
	}
	var rows []serviceRow
	for _, c := range s.list() {
		if !c.can(r, "read", Resource{Kind: "overview"}) {
			continue // a service this identity may not see is not listed
		}
		row := serviceRow{Name: c.service, Path: c.cfg.Prefix + "/"}
		d, err := c.overviewData(r)
		if err != nil {
			row.Error = err.Error()
		} else {
			row.overviewData = d
			for _, cr := range d.Consumers {
				row.InboxDead += cr.Dead
				row.InboxDeadMore = row.InboxDeadMore || cr.More
			}
		}
		rows = append(rows, row)
	}
	s.top.render(w, r, http.StatusOK, "services", "Services", "", struct{ Services []serviceRow }{rows})
}
