-- See 0014: the kind CHECK as CockroachDB names it.
ALTER TABLE pulpitum_v4_jobs DROP CONSTRAINT IF EXISTS check_kind
