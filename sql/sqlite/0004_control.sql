-- The control plane (see the PostgreSQL migrations 0006 to 0009): per-table policies, the
-- store-wide pause and job history. Durations are INTEGER microseconds, times INTEGER
-- microseconds since the Unix epoch (UTC).
CREATE TABLE pulpitum_v4_policies (
    table_id         TEXT    NOT NULL PRIMARY KEY,
    archive_after_us INTEGER CHECK (archive_after_us IS NULL OR archive_after_us >= 0),
    payload_format   TEXT,
    cleanup_delay_us INTEGER CHECK (cleanup_delay_us IS NULL OR cleanup_delay_us >= 0),
    paused           INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    updated_at       INTEGER NOT NULL
) STRICT;

CREATE TABLE pulpitum_v4_store_control (
    id         INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    paused     INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    updated_at INTEGER NOT NULL
) STRICT;

CREATE TABLE pulpitum_v4_jobs (
    table_id      TEXT    NOT NULL,
    partition_key BLOB    NOT NULL,
    bucket_key    TEXT    NOT NULL,
    generation    INTEGER NOT NULL,
    kind          TEXT    NOT NULL CHECK (kind IN ('archive', 'cleanup')),
    worker        TEXT    NOT NULL,
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER,
    outcome       TEXT    NOT NULL CHECK (outcome IN ('running', 'published', 'cleaned',
        'deferred', 'lease_lost', 'failed', 'interrupted', 'abandoned')),
    row_count     INTEGER,
    byte_count    INTEGER,
    error         TEXT,
    PRIMARY KEY (table_id, partition_key, bucket_key, generation)
) STRICT, WITHOUT ROWID;

CREATE INDEX pulpitum_v4_jobs_by_start ON pulpitum_v4_jobs (started_at);
