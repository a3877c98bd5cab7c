-- millrace 003: hardening of the outbox. Not schema-qualified: the migrator
-- sets search_path.

-- A lane outside 0..127 (written by a tool other than the Writer) would never
-- be claimed: refuse it at insert time instead. The lane stays computed by
-- the writer (FNV-1a of the partition key modulo 128, outbox.Lane): another
-- tool must compute it the same way, and the check catches one that does not
-- even stay in range.
ALTER TABLE outbox_event ADD CONSTRAINT outbox_event_lane_range CHECK (lane BETWEEN 0 AND 127);
ALTER TABLE outbox_pending ADD CONSTRAINT outbox_pending_lane_range CHECK (lane BETWEEN 0 AND 127);

-- One table rewrite for both changes below.
--
-- payload: json, not jsonb. json keeps the text exactly as written (key
-- order, duplicate keys, number spelling, whitespace, \u0000 escapes), so
-- the relay delivers the payload byte for byte: consumers verify signatures
-- and hashes over it. The json -> and ->> operators still work in ad hoc
-- queries. Rows written before keep jsonb's normalized text.
--
-- Identity: an event is (event_id, topic). Watermill's msg.Copy() keeps the
-- UUID, and publishing one message to two topics is a legitimate fan-out:
-- each topic gets its own event. The same id twice on one topic is still
-- refused. The unique index leads with event_id, so lookups by id (the
-- Admin's requeue and discard) keep their index.
ALTER TABLE outbox_event
    ALTER COLUMN payload TYPE json USING payload::json,
    DROP CONSTRAINT outbox_event_event_id_key,
    ADD CONSTRAINT outbox_event_event_id_topic_key UNIQUE (event_id, topic);
