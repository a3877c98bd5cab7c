-- millrace 013: one audit trail of every operator action (the console, the
-- millrace command and the Go API; one by one or in bulk), and the
-- confirmer of a bulk saga operation. Not schema-qualified: the migrator
-- sets search_path.

-- audit_log is one operator action, written in the transaction of the
-- action itself: who acted (operator), on whose plan (on_behalf_of: the
-- planner of a bulk operation someone else confirmed), why (reason), from
-- where (source: "console 203.0.113.7", "cli alice@host", "go"), what
-- (action, such as saga.retry or outbox.requeue, and its outcome: done,
-- requested, applied, refused), on which resource (kind, scope such as a
-- saga type or an inbox consumer, target such as a saga or event id), as
-- part of which bulk operation, the state before and after, and details.
-- Nothing in it is a payload.
CREATE TABLE audit_log (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    operator     text        NOT NULL,
    on_behalf_of text        NOT NULL DEFAULT '',
    reason       text        NOT NULL,
    source       text        NOT NULL,
    action       text        NOT NULL,
    outcome      text        NOT NULL,
    kind         text        NOT NULL,
    scope        text        NOT NULL DEFAULT '',
    target       text        NOT NULL DEFAULT '',
    operation    text        NOT NULL DEFAULT '',
    before       jsonb,
    after        jsonb,
    detail       jsonb
);

-- Retention removes the oldest entries, in at order.
CREATE INDEX audit_log_at_idx ON audit_log (at);
-- One resource's trail, newest first (millrace audit list --target).
CREATE INDEX audit_log_target_idx ON audit_log (target, id DESC);
-- One bulk operation's entries.
CREATE INDEX audit_log_operation_idx ON audit_log (operation, id DESC) WHERE operation <> '';

-- The operator who confirmed (applied) a bulk operation: the one who acts,
-- beside its planner (operator). NULL until it is applied.
ALTER TABLE saga_bulk_operation ADD COLUMN confirmed_by text;
