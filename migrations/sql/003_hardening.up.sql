-- millrace 003: hardening of the outbox. Not schema-qualified: the migrator
-- sets search_path.

-- A lane outside 0..127 (written by a tool other than the Writer) would never
-- be claimed: refuse it at insert time instead.
ALTER TABLE outbox_event ADD CONSTRAINT outbox_event_lane_range CHECK (lane BETWEEN 0 AND 127);
ALTER TABLE outbox_pending ADD CONSTRAINT outbox_pending_lane_range CHECK (lane BETWEEN 0 AND 127);
