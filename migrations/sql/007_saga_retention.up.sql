-- millrace 007: the saga retention job (saga.Cleaner). Not schema-qualified:
-- the migrator sets search_path.

-- The Cleaner walks the ended sagas of one status oldest first, in batches
-- (status = ... AND (ended_at, id) > (...) AND ended_at < cutoff ORDER BY
-- ended_at, id). Live sagas have no ended_at, so the partial index holds
-- only ended ones.
CREATE INDEX saga_instance_ended_idx ON saga_instance (status, ended_at, id) WHERE ended_at IS NOT NULL;
