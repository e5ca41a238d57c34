-- History is read newest first and pruned oldest first, both by start time.
CREATE INDEX IF NOT EXISTS pulpitum_v4_jobs_by_start
    ON pulpitum_v4_jobs (started_at)
