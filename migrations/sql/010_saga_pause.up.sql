-- millrace 010: pausing a saga and starting one at a set time (package
-- saga: Orchestrator.Pause, Resume, StartAt). Not schema-qualified: the
-- migrator sets search_path.

-- Two more statuses: paused (an operator paused it; it takes no step and
-- fires no timer until resumed) and scheduled (started with a start time
-- that has not come yet: its row exists, its first step runs when due).
ALTER TABLE saga_instance DROP CONSTRAINT saga_instance_status_check;
ALTER TABLE saga_instance ADD CONSTRAINT saga_instance_status_check
    CHECK (status IN ('running', 'compensating', 'completed', 'compensated', 'stuck', 'paused', 'scheduled'));

-- saga_pause is one row per paused saga: when it was paused (Resume pushes
-- the step's timeout and the saga's deadline by the time it was paused)
-- and the status it returns to. Resume deletes it.
CREATE TABLE saga_pause (
    saga_id       text        PRIMARY KEY,
    paused_at     timestamptz NOT NULL,
    resume_status text        NOT NULL CHECK (resume_status IN ('running', 'compensating'))
);

-- saga_held_reply is a reply that arrived while its saga was paused: the
-- reply handler stores it (in the transaction of the reply's inbox mark,
-- so once) and acknowledges the message; Resume applies the saga's held
-- replies in arrival order (seq) and deletes them.
CREATE TABLE saga_held_reply (
    seq        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    saga_id    text        NOT NULL,
    at         timestamptz NOT NULL,
    event_id   text        NOT NULL DEFAULT '',
    step       text        NOT NULL,
    operation  text        NOT NULL,
    attempt    integer     NOT NULL,
    outcome    text        NOT NULL,
    reason     text        NOT NULL DEFAULT '',
    payload    bytea
);

-- One saga's held replies in arrival order.
CREATE INDEX saga_held_reply_saga_idx ON saga_held_reply (saga_id, seq);
