-- Fails if an event id is used on two topics, or a payload holds \u0000
-- (jsonb cannot store it): resolve those rows first.
ALTER TABLE outbox_event
    DROP CONSTRAINT outbox_event_event_id_topic_key,
    ADD CONSTRAINT outbox_event_event_id_key UNIQUE (event_id),
    ALTER COLUMN payload TYPE jsonb USING payload::jsonb;
ALTER TABLE outbox_pending DROP CONSTRAINT outbox_pending_lane_range;
ALTER TABLE outbox_event DROP CONSTRAINT outbox_event_lane_range;
