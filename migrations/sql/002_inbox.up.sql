-- millrace 002: the inbox: exactly-once effects on the consumer side (the
-- dedup mark commits in the same transaction as the handler's effects). Not schema-qualified: the migrator sets search_path.

-- processed_event is the default dedup: one row per (consumer, event) that a
-- handler applied, inserted with ON CONFLICT DO NOTHING in the handler's own
-- transaction, so the mark commits with the effects and never before them.
CREATE TABLE processed_event (
    consumer     text        NOT NULL,
    event_id     uuid        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

-- The retention job deletes marks older than its window by processed_at. A
-- BRIN index: marks arrive in processed_at order, and a BRIN index costs the
-- hot insert almost nothing (a btree here cost the dedup middleware ~10%).
CREATE INDEX processed_event_processed_at_idx ON processed_event USING brin (processed_at);

-- inbox_event is the store-then-process inbox: the receiver inserts each
-- message (ON CONFLICT DO NOTHING) and acknowledges the broker at once; a
-- processor applies the unprocessed rows at its own pace. Several inboxes
-- (consumers) share the table. The payload is kept byte for byte (JSON or
-- binary), the Watermill metadata as jsonb.
CREATE TABLE inbox_event (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer        text        NOT NULL,
    event_id        uuid        NOT NULL,
    topic           text        NOT NULL DEFAULT '',
    partition_key   text        NOT NULL DEFAULT '',
    payload         bytea       NOT NULL,
    metadata        jsonb       NOT NULL DEFAULT '{}',
    received_at     timestamptz NOT NULL DEFAULT now(),
    processed       boolean     NOT NULL DEFAULT false,
    processed_at    timestamptz,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at timestamptz,
    dead_at         timestamptz, -- dead-lettered after too many attempts; waits for requeue or discard
    discarded_at    timestamptz, -- an operator discarded it (it is then also processed)
    CONSTRAINT inbox_event_consumer_event_id_key UNIQUE (consumer, event_id)
);

-- The processors' claim: live unprocessed rows of a consumer in arrival
-- order. Processed and dead rows leave the index, so it stays small.
CREATE INDEX inbox_event_unprocessed_idx ON inbox_event (consumer, id)
    WHERE NOT processed AND dead_at IS NULL;

-- Per-key order: "is there an earlier unprocessed row of this key?"
CREATE INDEX inbox_event_unprocessed_key_idx ON inbox_event (consumer, partition_key, id)
    WHERE NOT processed AND partition_key <> '';

-- The dead-letter list.
CREATE INDEX inbox_event_dead_idx ON inbox_event (consumer, id)
    WHERE dead_at IS NOT NULL AND NOT processed;

-- The retention job deletes processed rows older than its window.
CREATE INDEX inbox_event_processed_at_idx ON inbox_event (processed_at)
    WHERE processed;
