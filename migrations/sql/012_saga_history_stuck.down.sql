DROP INDEX IF EXISTS saga_history_stuck_idx;
