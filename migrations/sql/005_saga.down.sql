DROP TABLE saga_history;
DROP TABLE saga_instance;
