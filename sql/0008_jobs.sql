-- Job history: one row per archive or cleanup attempt, named by the claim's generation
-- (unique per bucket). Written beside the lifecycle's transactions, never inside them.
CREATE TABLE IF NOT EXISTS pulpitum_v4_jobs (
    table_id TEXT NOT NULL,
    partition_key BYTEA NOT NULL,
    bucket_key TEXT NOT NULL,
    generation INT8 NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('archive', 'cleanup')),
    worker TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL,
    finished_at TIMESTAMPTZ NULL,
    outcome TEXT NOT NULL CHECK (outcome IN ('running', 'published', 'cleaned', 'deferred',
        'lease_lost', 'failed', 'interrupted', 'abandoned')),
    row_count INT8 NULL,
    byte_count INT8 NULL,
    error TEXT NULL,
    PRIMARY KEY (table_id, partition_key, bucket_key, generation)
)
