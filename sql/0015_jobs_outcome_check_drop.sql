-- See 0014: the outcome CHECK as PostgreSQL names it.
ALTER TABLE pulpitum_v4_jobs DROP CONSTRAINT IF EXISTS pulpitum_v4_jobs_outcome_check
