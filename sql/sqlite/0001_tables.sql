-- Table registry: one row per logical table. The bucket strategy and surface are immutable
-- (enforced by the store when registering), so buckets never change meaning.
CREATE TABLE pulpitum_v4_tables (
    table_id              TEXT    NOT NULL PRIMARY KEY,
    bucket_strategy       TEXT    NOT NULL
        CHECK (bucket_strategy IN ('calendar_year_utc', 'calendar_month_utc', 'calendar_day_utc')),
    writable_buckets      INTEGER CHECK (writable_buckets IS NULL OR writable_buckets >= 0),
    record_schema_version INTEGER NOT NULL,
    surface               TEXT    NOT NULL,
    created_at            INTEGER NOT NULL -- microseconds since the Unix epoch, UTC
) STRICT;
