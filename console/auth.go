package console

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
)

// Identity is who is asking: what Config.Authenticate makes of a request.
type Identity struct {
	// Name identifies the person or service: it is recorded as the
	// operator of every action they take, and shown on every page.
	// Required.
	Name string
	// Roles are the identity's roles or groups, for Config.Authorize. The
	// built-in authorizer (ByRole) knows "viewer", "operator" and "admin".
	Roles []string
}

// Action is what an identity asks to do, for Config.Authorize:
//
//	"read"          see a page: an overview, a list, a saga, the audit trail
//	"read-payload"  see payloads unredacted: a saga's data, a dead letter's body
//	"act"           act on one saga (Resource.Op: retry, skip, mark-compensated,
//	                abort, pause, resume, withdraw)
//	"act-bulk"      plan or confirm a bulk action on sagas (Resource.Op: the action)
//	"requeue"       requeue dead letters (outbox, inbox) or poisoned messages,
//	                one or in bulk
//	"discard"       discard dead letters (outbox, inbox), one or in bulk
type Action string

// Resource is what an Action is on, for Config.Authorize and Config.Redact.
type Resource struct {
	// Service is the service's name in a console over several
	// (Config.Services, DiscoverServices); "" in a console of one.
	Service string
	// Kind is what it is: "overview", "outbox" (the outbox's dead
	// letters), "inbox" (an inbox's), "saga", "poison" (a poison topic),
	// "kafka" (consumer lag) or "audit" (the audit trail).
	Kind string
	// Type narrows Kind: a saga's type (for a bulk action, the type its
	// filter selects, "" for any), an inbox's consumer, a poison topic.
	// "" for all of Kind.
	Type string
	// ID is the one item: a saga id, an event id, a poisoned message's
	// UUID, a bulk operation's id. "" for a list or a bulk selection.
	ID string
	// Op is the saga action of "act" and "act-bulk".
	Op string
}

// Built-in roles, as ByRole reads Identity.Roles.
var roleActions = map[string][]Action{
	"viewer":   {"read"},
	"operator": {"read", "read-payload", "act", "act-bulk", "requeue"},
	"admin":    {"read", "read-payload", "act", "act-bulk", "requeue", "discard"},
}

// operatorBulk are the bulk saga actions an operator may take; the others
// (skip, mark-compensated and abort, in bulk) are an admin's.
var operatorBulk = []string{"retry", "pause", "resume"}

// ByRole is the built-in authorizer, Config.Authorize's default. It knows
// three roles, by name in Identity.Roles (an identity with several has
// what each allows):
//
//   - viewer: reads every page; payloads are redacted.
//   - operator: a viewer who also reads payloads, acts on one saga (every
//     action), retries, pauses and resumes sagas in bulk, and requeues
//     dead letters and poisoned messages.
//   - admin: an operator who also discards dead letters and skips, marks
//     compensated and aborts sagas in bulk.
//
// It returns nil when who may take action on res, else an error saying
// why not. A host's own Authorize can call it for what it does not decide
// itself.
func ByRole(_ context.Context, who Identity, action Action, res Resource) error {
	for _, role := range who.Roles {
		if !slices.Contains(roleActions[role], action) {
			continue
		}
		if action == "act-bulk" && role == "operator" && !slices.Contains(operatorBulk, res.Op) {
			continue
		}
		return nil
	}
	var known []string
	for _, role := range who.Roles {
		if roleActions[role] != nil {
			known = append(known, role)
		}
	}
	what := string(action)
	if res.Op != "" {
		what += " (" + res.Op + ")"
	}
	if len(known) == 0 {
		return fmt.Errorf("%s has no console role (viewer, operator or admin), so may not %s", who.Name, what)
	}
	need := "an operator or an admin"
	if action == "discard" || action == "act-bulk" {
		need = "an admin"
	}
	return fmt.Errorf("%s is %s, and only %s may %s", who.Name, strings.Join(known, " and "), need, what)
}

// errNoIdentity is what the authenticators return for a request that
// does not say who is asking (or says it from where it may not).
var errNoIdentity = errors.New("the request does not say who is asking")

// ProxyAuth returns an authenticator for a console behind an
// authenticating proxy (oauth2-proxy, a company SSO gateway) that sets
// the user's name in userHeader (default X-Forwarded-User) and their
// groups, comma-separated, in rolesHeader (default X-Forwarded-Groups):
// the groups are the identity's roles. It believes those headers only on
// a request whose peer address (http.Request.RemoteAddr, not a forwarded
// one) is in proxies; a request from anywhere else gets no identity, and
// the console refuses it (401), whatever headers it carries.
//
// Threat model: whoever can reach the console's listener without passing
// the proxy must not be inside proxies. List the proxy's own addresses,
// not a whole network others share; on the proxy, strip those headers
// from the client's request before setting them.
func ProxyAuth(userHeader, rolesHeader string, proxies ...netip.Prefix) func(*http.Request) (Identity, error) {
	if userHeader == "" {
		userHeader = "X-Forwarded-User"
	}
	if rolesHeader == "" {
		rolesHeader = "X-Forwarded-Groups"
	}
	return func(r *http.Request) (Identity, error) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			host = r.RemoteAddr
		}
		addr, err := netip.ParseAddr(host)
		if err != nil {
			return Identity{}, fmt.Errorf("%w: peer address %q", errNoIdentity, r.RemoteAddr)
		}
		addr = addr.Unmap()
		if !slices.ContainsFunc(proxies, func(p netip.Prefix) bool { return p.Contains(addr) }) {
			return Identity{}, fmt.Errorf("%w: %s is not a trusted proxy, so its %s header is not believed", errNoIdentity, addr, userHeader)
		}
		name := strings.TrimSpace(r.Header.Get(userHeader))
		if name == "" {
			return Identity{}, fmt.Errorf("%w: the proxy set no %s header", errNoIdentity, userHeader)
		}
		return Identity{Name: name, Roles: splitRoles(r.Header.Get(rolesHeader))}, nil
	}
}

// TokenAuth returns an authenticator for a bearer token or a session the
// host checks: it takes the token from the request's "Authorization:
// Bearer" header, else from the cookie named cookie (when not ""), and
// returns what check makes of it (check's error refuses the request: 401).
// check is the host's: an OpenID Connect ID token verified with a
// well-kept library (docs/operating.md shows one), a session id looked up
// in the host's session store. The console never verifies a token itself.
func TokenAuth(cookie string, check func(ctx context.Context, token string) (Identity, error)) func(*http.Request) (Identity, error) {
	return func(r *http.Request) (Identity, error) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok && cookie != "" {
			if c, err := r.Cookie(cookie); err == nil {
				token, ok = c.Value, true
			}
		}
		if token = strings.TrimSpace(token); !ok || token == "" {
			return Identity{}, fmt.Errorf("%w: no bearer token or session", errNoIdentity)
		}
		return check(r.Context(), token)
	}
}

func splitRoles(s string) []string {
	var out []string
	for _, role := range strings.Split(s, ",") {
		if role = strings.TrimSpace(role); role != "" {
			out = append(out, role)
		}
	}
	return out
}

type identityKey struct{}

// identity is who asks r, as authenticate put it in the context.
func identity(r *http.Request) Identity {
	id, _ := r.Context().Value(identityKey{}).(Identity)
	return id
}

// authenticate serves next only to a request Config.Authenticate gives an
// identity with a name; it refuses any other with 401, changing nothing.
// The console's stylesheet (under static) is served to anyone: the
// refusal page uses it.
func (c *Console) authenticate(static string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := r.Context().Value(identityKey{}).(Identity); ok || strings.HasPrefix(r.URL.Path, static) {
			next.ServeHTTP(w, r)
			return
		}
		id, err := c.cfg.Authenticate(r)
		if err == nil && strings.TrimSpace(id.Name) == "" {
			err = errNoIdentity
		}
		if err != nil {
			c.log.Warn("console: request refused: no identity", "err", err, "path", r.URL.Path, "remote", r.RemoteAddr)
			c.fail(w, r, http.StatusUnauthorized, "The console cannot tell who you are, so it shows nothing and changes nothing: "+err.Error()+".")
			return
		}
		id.Name = strings.TrimSpace(id.Name)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), identityKey{}, id)))
	})
}

// resource is res in this console's service.
func (c *Console) resource(res Resource) Resource {
	res.Service = c.service
	return res
}

// authorized asks Config.Authorize whether r's identity may take action
// on res; read-only mode refuses every action but reading.
func (c *Console) authorized(r *http.Request, action Action, res Resource) error {
	if c.cfg.ReadOnly && action != "read" && action != "read-payload" {
		return errors.New("the console is read-only")
	}
	return c.cfg.Authorize(r.Context(), identity(r), action, c.resource(res))
}

// can reports whether r's identity may take action on res: what the pages
// draw buttons for.
func (c *Console) can(r *http.Request, action Action, res Resource) bool {
	return c.authorized(r, action, res) == nil
}

// allow is authorized for a handler: when the action is forbidden it
// logs it, shows why (403) and reports false; nothing was changed.
func (c *Console) allow(w http.ResponseWriter, r *http.Request, action Action, res Resource) bool {
	err := c.authorized(r, action, res)
	if err == nil {
		return true
	}
	who := identity(r)
	c.log.Warn("console: forbidden", "operator", who.Name, "action", string(action), "kind", res.Kind, "type", res.Type,
		"id", res.ID, "op", res.Op, "err", err)
	msg := "Forbidden: " + err.Error() + "."
	if action != "read" && action != "read-payload" {
		msg += " Nothing was changed."
	}
	c.fail(w, r, http.StatusForbidden, msg)
	return false
}

// from is where r comes from, for the audit trail: "console" and the
// peer's address, and the forwarded addresses a proxy gave.
func from(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	s := "console " + host
	if xff := strings.TrimSpace(r.Header.Get("X-Forwarded-For")); xff != "" {
		s += " (forwarded for " + xff + ")"
	}
	return s
}
