ALTER TABLE compensation_barrier DROP COLUMN IF EXISTS attempt;
