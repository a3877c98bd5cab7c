DROP TABLE IF EXISTS compensation_barrier;
