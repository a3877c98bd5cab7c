DROP INDEX IF EXISTS saga_instance_ended_idx;
