DROP TABLE IF EXISTS outbox_lane;
DROP TABLE IF EXISTS outbox_pending;
DROP TABLE IF EXISTS outbox_event;
