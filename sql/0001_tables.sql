-- Registry of logical tables. The bucket strategy is fixed for a table's lifetime: the store
-- refuses to register an existing id with a different definition.
CREATE TABLE IF NOT EXISTS pulpitum_v4_tables (
    table_id TEXT NOT NULL PRIMARY KEY,
    bucket_strategy TEXT NOT NULL,
    writable_buckets INT4 NULL,
    record_schema_version INT4 NOT NULL,
    surface TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
