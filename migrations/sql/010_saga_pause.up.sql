-- Placeholder for the migration of another branch (same file name): the lead takes that branch's file at merge.
SELECT 1;
