-- One row per bucket: its state machine (hot -> archiving -> archived), the fencing
-- generation and owner token of the current claim, its lease, the durable retry time of a
-- deferred bucket and, once published, the manifest key that routes reads to the archive.
CREATE TABLE IF NOT EXISTS pulpitum_v4_bucket_metadata (
    table_id TEXT NOT NULL,
    partition_key BYTEA NOT NULL,
    bucket_key TEXT NOT NULL,
    bucket_strategy TEXT NOT NULL,
    bucket_start TIMESTAMPTZ NOT NULL,
    bucket_end TIMESTAMPTZ NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('hot', 'archiving', 'archived')),
    owner_token TEXT NULL,
    generation INT8 NOT NULL DEFAULT 0,
    lease_expires_at TIMESTAMPTZ NULL,
    retry_at TIMESTAMPTZ NULL,
    object_key TEXT NULL,
    hot_deleted BOOL NOT NULL DEFAULT false,
    published_at TIMESTAMPTZ NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (table_id, partition_key, bucket_key)
)
