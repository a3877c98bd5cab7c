DROP INDEX IF EXISTS saga_instance_parent_idx;
ALTER TABLE saga_instance DROP COLUMN IF EXISTS parent;
ALTER TABLE saga_event DROP COLUMN IF EXISTS key_type, DROP COLUMN IF EXISTS key_name, DROP COLUMN IF EXISTS key_value,
    DROP COLUMN IF EXISTS child;
DROP TABLE IF EXISTS saga_attr;
