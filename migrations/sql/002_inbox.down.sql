DROP TABLE IF EXISTS inbox_event;
DROP TABLE IF EXISTS processed_event;
