-- A paused saga holds replies only this migration's tables know of: resume
-- the paused sagas first (saga.Orchestrator.Resume), then migrate down.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM saga_instance WHERE status = 'paused') THEN
        RAISE EXCEPTION 'millrace 010 down: paused sagas exist: resume them first';
    END IF;
END $$;
-- A scheduled saga that has not started ends: nothing of it ran, and the
-- older millrace cannot start it.
UPDATE saga_instance SET status = 'compensated', next_wakeup_at = NULL, ended_at = now(), updated_at = now(),
       last_error = 'its scheduled start was dropped by migrating millrace down from 010', version = version + 1
 WHERE status = 'scheduled';
DROP TABLE saga_held_reply;
DROP TABLE saga_pause;
ALTER TABLE saga_instance DROP CONSTRAINT saga_instance_status_check;
ALTER TABLE saga_instance ADD CONSTRAINT saga_instance_status_check
    CHECK (status IN ('running', 'compensating', 'completed', 'compensated', 'stuck'));
