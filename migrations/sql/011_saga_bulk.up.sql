-- millrace 011: bulk operator actions on sagas selected by a query
-- (saga.Operator.Plan, Apply, Bulk). Not schema-qualified: the migrator
-- sets search_path.

-- saga_bulk_operation is one bulk action: who, why, the action, the query
-- that selected its sagas (as JSON), when it was planned and when its
-- requests were all filed (NULL until then).
CREATE TABLE saga_bulk_operation (
    id         text        PRIMARY KEY,
    action     text        NOT NULL,
    operator   text        NOT NULL,
    reason     text        NOT NULL,
    query      jsonb       NOT NULL,
    created_at timestamptz NOT NULL,
    selected   bigint      NOT NULL,          -- how many sagas the query selected
    filed_at   timestamptz                    -- when the last of its requests was filed
);

-- saga_bulk_item is one selected saga of an operation, with its revision
-- as selected (a saga that changed before its request is filed is
-- refused) and where it stands: selected (not filed yet), filed (an
-- operator request waits for the orchestrator), applied, refused at
-- filing (by reason: changed, not_allowed, request_pending, not_found),
-- or refused_on_apply: filed, then refused by the orchestrator (changed,
-- not_allowed, not_registered, failed, withdrawn).
CREATE TABLE saga_bulk_item (
    operation_id text        NOT NULL REFERENCES saga_bulk_operation (id) ON DELETE CASCADE,
    saga_id      text        NOT NULL,
    revision     bigint      NOT NULL,
    state        text        NOT NULL DEFAULT 'selected',
    reason       text        NOT NULL DEFAULT '',
    error        text        NOT NULL DEFAULT '',
    at           timestamptz,
    PRIMARY KEY (operation_id, saga_id),
    CONSTRAINT saga_bulk_item_state_check CHECK (state IN ('selected', 'filed', 'applied', 'refused', 'refused_on_apply'))
);

-- An operation's progress counts (GROUP BY state, reason: an index-only
-- scan of one operation's range) and the filing pass's pick of the next
-- selected items in saga id order (a range, no sort).
CREATE INDEX saga_bulk_item_state_idx ON saga_bulk_item (operation_id, state, reason, saga_id);

-- The selection by status and current step (e.g. every saga stuck at
-- reserve_credit), newest first; the type, age and last-error conditions
-- filter the rows it finds.
CREATE INDEX IF NOT EXISTS saga_instance_status_step_idx ON saga_instance (status, step, created_at DESC, id DESC);
