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
// data-step and data-state attributes. The layout comes from the
// definition registered with Config.Sagas (saga.Orchestrator.DefinitionSteps);
// without it the page draws the steps that started, one column each, in
// the order they started. The overview charts the sagas started,
// completed, compensated and stuck per minute over the last hour (one
// query on saga_history_outcome_at_idx, migration 008) and shows the
// oldest pending outbox event's age on a bar full at an hour: its current
// value only, as no history of it is kept.
//
// # Actions
//
// A button opens a confirm page (a GET, which changes nothing) saying what
// will happen; only its form, a POST, acts. Every POST must carry an
// anti-CSRF token: the signed double-submit pattern (a random nonce in an
// HttpOnly SameSite=Strict cookie, and its HMAC under Config.CSRFKey in the
// form). Browsers' cross-origin POSTs are also refused by
// http.CrossOriginProtection. A POST without a valid token, in read-only
// mode, or for an id that is not a dead letter changes nothing and gets an
// error page. Each action is logged on Config.Logger with the operator
// (Config.Operator, by default the X-Forwarded-User header your
// authenticating proxy sets, else "console"), the event id and the count.
// The console has no login of its own: put it behind your proxy.
//
// The dead-letter pages filter (the outbox's and an inbox's by topic,
// partition key, last error like an SQL LIKE pattern and age; a poison
// topic's by reason like, original topic and age) and, once filtered,
// offer "requeue or discard all N matching" (a poison topic: requeue only,
// as Kafka cannot delete one message from a topic). Its confirm page shows
// the count and the first selected; its POST acts on what the filter
// selects then (outbox.Admin.RequeueMatching and the like) and is logged
// with the operator, an optional reason, the filter and the counts.
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
// page's data as .Data), one handler that calls render, and one entry in
// nav. Actions go through post, which checks read-only mode and the token
// before the handler runs. The sagas pages (the list by status, one saga's
// steps and history, and the operator actions with their confirm step)
// are built this way.
package console
