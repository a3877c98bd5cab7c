-- millrace 008: the console's per-minute saga charts (sagas started,
-- completed, compensated and stuck over the last hour). Not
-- schema-qualified: the migrator sets search_path.

-- A saga's outcome lines of saga_history by time: a partial index that
-- holds at most a few lines per saga (started, its end, each time it got
-- stuck), so a range scan over the last hour reads only those lines
-- however long the history is.
CREATE INDEX saga_history_outcome_at_idx ON saga_history (at)
    WHERE event IN ('started', 'completed', 'compensated', 'stuck');
