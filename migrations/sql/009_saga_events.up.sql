-- millrace 009: external events a saga waits for (saga.SignalTx, wait
-- steps). Not schema-qualified: the migrator sets search_path.

-- saga_event is every event delivered to a saga, in order of arrival
-- (arrived), whatever became of it. state:
--   new      stored by a signaller that could not lock the saga (the
--            orchestrator held it): the orchestrator's timer pass applies
--            or classifies it;
--   pending  arrived before the saga reached a step waiting for it: the
--            step consumes it when the saga gets there;
--   consumed applied by the wait step named in step;
--   ignored  came after the wait it was for (a later event of an any-of
--            wait, or one after the wait had timed out or the saga ended);
--   refused  for an ended saga, or a name no step of its definition
--            waits for (the signaller got an error).
-- A delivery repeated with the same event_id is one row: it applies once.
CREATE TABLE saga_event (
    arrived  bigserial   PRIMARY KEY,
    saga_id  text        NOT NULL,
    name     text        NOT NULL,
    event_id text        NOT NULL,
    payload  jsonb,
    state    text        NOT NULL,
    step     text        NOT NULL DEFAULT '', -- the wait step that consumed it
    at       timestamptz NOT NULL,            -- when it arrived (the orchestrator's clock)
    CONSTRAINT saga_event_state_check CHECK (state IN ('new', 'pending', 'consumed', 'ignored', 'refused')),
    CONSTRAINT saga_event_once UNIQUE (saga_id, event_id)
);

-- A wait step's look for stored events, in arrival order: only the
-- events still to be consumed, a handful per saga.
CREATE INDEX saga_event_open_idx ON saga_event (saga_id, arrived) WHERE state IN ('new', 'pending');
-- The timer pass's pickup of events no one has applied yet.
CREATE INDEX saga_event_new_idx ON saga_event (saga_id) WHERE state = 'new';
