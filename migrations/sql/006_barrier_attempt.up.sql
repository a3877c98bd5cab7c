-- millrace 006: a business failure of an action no longer blocks a later
-- attempt of it (package compensation). Not schema-qualified: the migrator
-- sets search_path.

-- attempt is the command attempt that wrote the row's outcome. A failure
-- promises no effect, so a later attempt of the same step (a higher
-- attempt number) claims the action's failure row again and runs the
-- action; an earlier or the same attempt (a late or redelivered command)
-- is answered with the stored failure. A compensation that finds the
-- failure turns it into cancelled, which blocks the action for good, as
-- before. Rows from before this migration have attempt 0: any attempt
-- claims their failure again.
ALTER TABLE compensation_barrier ADD COLUMN attempt integer NOT NULL DEFAULT 0;
