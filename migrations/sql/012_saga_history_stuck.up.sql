-- millrace 012: the saga Cleaner's check for a stuck episode. Not
-- schema-qualified: the migrator sets search_path.

-- The Cleaner keeps a saga that was ever stuck longer; each batch looks for
-- its candidates' stuck lines (event = 'stuck' OR status = 'stuck'). Without
-- this index the planner hashed those lines from a scan of the whole
-- history, every batch: at ten million history rows a batch of 500 sagas
-- took a second. The partial index holds only the stuck lines, a few per
-- saga that was ever stuck.
CREATE INDEX IF NOT EXISTS saga_history_stuck_idx ON saga_history (saga_id) WHERE event = 'stuck' OR status = 'stuck';
