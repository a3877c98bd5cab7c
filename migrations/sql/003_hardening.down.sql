ALTER TABLE outbox_pending DROP CONSTRAINT outbox_pending_lane_range;
ALTER TABLE outbox_event DROP CONSTRAINT outbox_event_lane_range;
