-- Hot rows. The primary key is the physical identity (bucket, then clustering key), so a
-- bucket's rows are contiguous and ordered by (event_time, sort_key) for keyset paging.
CREATE TABLE IF NOT EXISTS pulpitum_v4_records (
    table_id TEXT NOT NULL,
    partition_key BYTEA NOT NULL,
    bucket_key TEXT NOT NULL,
    event_time TIMESTAMPTZ NOT NULL,
    sort_key BYTEA NOT NULL,
    value BYTEA NOT NULL,
    PRIMARY KEY (table_id, partition_key, bucket_key, event_time, sort_key)
)
