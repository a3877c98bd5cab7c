ALTER TABLE saga_bulk_operation DROP COLUMN IF EXISTS confirmed_by;
DROP TABLE IF EXISTS audit_log;
