DROP INDEX saga_instance_status_step_idx;
DROP TABLE saga_bulk_item;
DROP TABLE saga_bulk_operation;
