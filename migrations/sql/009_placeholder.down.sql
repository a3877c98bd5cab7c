-- Placeholder for migration 009, which another branch (wait steps and
-- external events) adds; this branch needs a 009 so its 010 loads. The
-- merge keeps the other branch's 009 and drops this file.
SELECT 1;
