-- millrace 004: the compensation barrier of saga participants (package
-- compensation). Not schema-qualified: the migrator sets search_path.

-- One row per (saga, step, operation) that reached this participant,
-- written in the participant handler's transaction with the effects and the
-- reply, so a row exists exactly when its effects committed.
--
--   action rows: outcome success or failure is the action's final answer,
--     re-sent to every later attempt; outcome cancelled means a
--     compensation came first (an empty compensation wrote it), and blocks
--     the action for good.
--   compensation rows: outcome success is final (empty marks a compensation
--     that found no action to undo); outcome failure records the last
--     business failure of a compensation that the orchestrator will retry.
--
-- Both operations upsert the action's row, so the primary key decides
-- atomically which of an action and its compensation came first.
CREATE TABLE compensation_barrier (
    saga_id    text        NOT NULL,
    step       text        NOT NULL,
    operation  text        NOT NULL,
    outcome    text        NOT NULL DEFAULT '',   -- '' only inside the writing transaction
    empty      boolean     NOT NULL DEFAULT false,
    reply      bytea       NOT NULL DEFAULT '\x', -- the reply payload, byte for byte
    reason     text        NOT NULL DEFAULT '',
    saga_type  text        NOT NULL DEFAULT '',
    command    text        NOT NULL DEFAULT '',
    deliveries integer     NOT NULL DEFAULT 1,    -- commands that reached the row (duplicates, late actions)
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(), -- last delivery; the cleaner's clock
    PRIMARY KEY (saga_id, step, operation),
    CONSTRAINT compensation_barrier_operation CHECK (operation IN ('action', 'compensation')),
    CONSTRAINT compensation_barrier_outcome CHECK (outcome IN ('', 'success', 'failure', 'cancelled'))
);

-- The cleaner looks for sagas whose rows are all older than its window. A
-- BRIN index: rows arrive in updated_at order and it costs the hot insert
-- almost nothing.
CREATE INDEX compensation_barrier_updated_at_idx ON compensation_barrier USING brin (updated_at);
