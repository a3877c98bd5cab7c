// Package console is millrace's web console: an http.Handler that a
// service mounts on its own mux to see and fix the outbox and the inboxes
// without writing Go or SQL.
//
//	c, err := console.New(pool, console.Config{Prefix: "/ops"})
//	mux.Handle("/ops/", c)
//
// or standalone: millrace console --listen :8080.
//
// # Pages
//
// The overview shows the outbox backlog (pending events, how old the oldest
// is, how many are retrying or dead) and which inboxes have dead letters.
// The dead-letter pages list the outbox's and each inbox's dead letters with
// their last error, a page at a time, with Requeue and Discard buttons.
// Every query is paginated and served by an index: outbox dead letters by
// outbox_pending_blocked_idx, inbox dead letters and their consumers by
// inbox_event_dead_idx, the backlog by the primary keys.
//
// # Pictures
//
// Drawn by the server as inline SVG (no script, no external assets). A
// saga's page draws its steps left to right in definition order, a
// parallel group's members side by side in one column, each box coloured
// by the step's state (pending, running, backoff, done, failed, uncertain,
// compensating, compensated, skipped) with its action and compensation
// attempts and the time it took (from its start to its latest history
// line, or to now while it runs). Each box is a <g class="step"> with
// data-step and data-state attributes; a child step's box (saga.Step.Child)
// links to the child saga its latest attempt started (data-child). The
// page lists a saga's child sagas and links a child to its parent. The
// layout comes from the
// definition registered with Config.Sagas (saga.Orchestrator.DefinitionSteps);
// without it the page draws the steps that started, one column each, in
// the order they started. The overview charts the sagas started,
// completed, compensated and stuck per minute over the last hour (one
// query on saga_history_outcome_at_idx, migration 008) and shows the
// oldest pending outbox event's age on a bar full at an hour: its current
// value only, as no history of it is kept.
//
// # Who may see and do what
//
// Config.Authenticate says who is asking (an Identity: a name and roles);
// a request it gives no name gets 401 and sees nothing. ProxyAuth believes
// an authenticating proxy's headers, only from the proxy's addresses;
// TokenAuth takes a bearer token or a session cookie and hands it to the
// host's check (an OpenID Connect ID token verified by a well-kept
// library: docs/operating.md shows one). Config.Authorize is asked for
// every page, every action and every button before it is drawn, with an
// Action (read, read-payload, act, act-bulk, requeue, discard) and the
// Resource (service, kind, saga type or consumer or topic, id, the saga
// action); ByRole, its default, knows the roles viewer, operator and
// admin. A forbidden action is refused (403) before anything is written,
// saying why. Config.Redact decides what of a payload reaches the page.
// Config.ReadOnly is one switch: no action buttons, every POST refused.
//
// # Actions
//
// A button opens a confirm page (a GET, which changes nothing) saying what
// will happen; only its form, a POST, acts, and it asks for a reason.
// Every POST must carry an anti-CSRF token: the signed double-submit
// pattern (a random nonce in an HttpOnly SameSite=Strict cookie, and the
// HMAC of it and the identity's name under Config.CSRFKey in the form, and
// in a meta tag of every page), so a token is good only for the identity
// it was made for. Browsers' cross-origin POSTs are also refused by
// http.CrossOriginProtection. A saga action's form carries the revision of
// the saga the operator saw on the confirm page: if the saga moved before
// the action is confirmed (a reply took it to another step), the action is
// refused as stale and nothing is done. A bulk saga operation is confirmed
// in the confirmer's name, on behalf of its planner. Every action lands in
// the audit trail (the audit page, millrace audit list) with the
// identity, the reason, where from (the client's address), the resource
// and the state before and after, in the transaction of the action; and
// in Config.Logger.
//
// The dead-letter pages filter (the outbox's and an inbox's by topic,
// partition key, last error like an SQL LIKE pattern and age; a poison
// topic's by reason like, original topic and age) and, once filtered,
// offer "requeue or discard all N matching" (a poison topic: requeue only,
// as Kafka cannot delete one message from a topic). Its confirm page shows
// the count and the first selected; its POST acts on what the filter
// selects then (outbox.Admin.RequeueMatching and the like), each dead
// letter in the audit trail with the operator and the reason.
//
// # Logging
//
// Config.Logger is a *slog.Logger. millrace's workers (outbox.Relay,
// inbox.Processor, the service's retention, kafka.Publisher) log through Watermill's
// LoggerAdapter; route them to the same slog logger with
// watermill.NewSlogLogger(logger). Fields carry one name everywhere:
// event_id, topic, partition_key, saga_id, consumer, component, schema,
// operator, attempt. See "millrace help logging".
//
// # Adding a page
//
// A page is one template in templates/ that defines "content" (the layout
// gives it the navigation, the operator, the CSRF token as .CSRF and the
// page's data as .Data), one handler that calls allow (the authorizer)
// and render, and one entry in nav. Actions go through post, which checks
// read-only mode and the token before the handler runs; the handler
// authorizes (allow) before it acts. The sagas pages (the list by status, one saga's
// steps and history, and the operator actions with their confirm step)
// are built this way.
package console
