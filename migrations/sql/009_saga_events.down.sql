DROP TABLE saga_event;
