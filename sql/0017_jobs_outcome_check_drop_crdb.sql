-- See 0014: the outcome CHECK as CockroachDB names it.
ALTER TABLE pulpitum_v4_jobs DROP CONSTRAINT IF EXISTS check_outcome
