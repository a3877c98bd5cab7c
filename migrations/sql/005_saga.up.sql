-- millrace 005_saga: the saga orchestrator's state (package saga). Not
-- schema-qualified: the migrator sets search_path.

-- saga_instance is one saga: its definition (type and version), where it
-- stands (status, phase, current step by name, per-step state), its data,
-- and when it next needs the orchestrator's attention (next_wakeup_at: a
-- step's timeout, a backoff retry, or the saga's deadline).
CREATE TABLE saga_instance (
    id             text        PRIMARY KEY,
    type           text        NOT NULL,
    def_version    integer     NOT NULL,
    status         text        NOT NULL,          -- running, compensating, completed, compensated, stuck
    phase          text        NOT NULL DEFAULT 'forward', -- forward or compensating (kept while stuck)
    step           text        NOT NULL DEFAULT '', -- current step's name ('' once ended)
    steps          jsonb       NOT NULL DEFAULT '{}', -- per-step state, keyed by step name
    data           jsonb       NOT NULL,
    input          jsonb       NOT NULL,          -- the data the saga was started with (idempotent start)
    version        bigint      NOT NULL DEFAULT 1, -- bumped by every change
    next_wakeup_at timestamptz,
    deadline_at    timestamptz,
    attempts       integer     NOT NULL DEFAULT 0, -- attempt number of the current operation
    last_error     text        NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    ended_at       timestamptz,
    -- A pending operator request (saga.Operator: retry, skip,
    -- mark-compensated or abort, recorded by a tool without the saga's
    -- definitions): {"action", "operator", "reason", "requested_at"}. The
    -- running orchestrator applies it and clears it; NULL when none.
    operator_request jsonb,
    CONSTRAINT saga_instance_status_check CHECK (status IN ('running', 'compensating', 'completed', 'compensated', 'stuck')),
    CONSTRAINT saga_instance_phase_check CHECK (phase IN ('forward', 'compensating'))
);

-- The scheduler claims due sagas with next_wakeup_at <= now ORDER BY
-- next_wakeup_at ... FOR UPDATE SKIP LOCKED; only live sagas have a wake-up,
-- so the partial index stays as small as the set of sagas in flight.
CREATE INDEX saga_instance_wakeup_idx ON saga_instance (next_wakeup_at) WHERE next_wakeup_at IS NOT NULL;

-- The orchestrator's pickup of pending operator requests: the partial
-- index holds only the sagas with one (a handful at any time).
CREATE INDEX saga_instance_operator_request_idx ON saga_instance (type) WHERE operator_request IS NOT NULL;

-- Listing by type and status, newest first (keyset on created_at, id).
CREATE INDEX saga_instance_type_status_idx ON saga_instance (type, status, created_at DESC, id DESC);
-- Listing by status across types (e.g. every stuck saga), newest first.
CREATE INDEX saga_instance_status_idx ON saga_instance (status, created_at DESC, id DESC);
-- Listing every saga by age.
CREATE INDEX saga_instance_created_idx ON saga_instance (created_at DESC, id DESC);

-- saga_history is every transition, reply (fenced ones too), timeout and
-- operator action, in order, per saga.
CREATE TABLE saga_history (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    saga_id    text        NOT NULL,
    at         timestamptz NOT NULL,
    event      text        NOT NULL,          -- started, command, reply, fenced, timeout, retry, transition, operator, ...
    step       text        NOT NULL DEFAULT '',
    operation  text        NOT NULL DEFAULT '',
    attempt    integer     NOT NULL DEFAULT 0,
    outcome    text        NOT NULL DEFAULT '',
    status     text        NOT NULL DEFAULT '', -- the saga's status after the event
    actor      text        NOT NULL DEFAULT '', -- the operator, for operator actions
    reason     text        NOT NULL DEFAULT '',
    detail     jsonb
);

-- One saga's history in order.
CREATE INDEX saga_history_saga_idx ON saga_history (saga_id, id);
