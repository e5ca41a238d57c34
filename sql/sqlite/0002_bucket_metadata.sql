-- Routing and fencing state of every bucket that ever received a record. Times are INTEGER
-- microseconds since the Unix epoch (UTC), the same precision as the PostgreSQL TIMESTAMPTZ
-- columns. The CHECKs keep a state and its route columns consistent, so a half-written
-- transition cannot be stored.
CREATE TABLE pulpitum_v4_bucket_metadata (
    table_id         TEXT    NOT NULL,
    partition_key    BLOB    NOT NULL,
    bucket_key       TEXT    NOT NULL,
    bucket_strategy  TEXT    NOT NULL,
    bucket_start     INTEGER NOT NULL,
    bucket_end       INTEGER NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('hot', 'archiving', 'archived')),
    owner_token      TEXT,
    generation       INTEGER NOT NULL DEFAULT 0 CHECK (generation >= 0),
    lease_expires_at INTEGER,
    retry_at         INTEGER,
    object_key       TEXT,
    hot_deleted      INTEGER NOT NULL DEFAULT 0 CHECK (hot_deleted IN (0, 1)),
    published_at     INTEGER,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    PRIMARY KEY (table_id, partition_key, bucket_key),
    CHECK (bucket_start < bucket_end),
    CHECK ((state = 'archived') = (object_key IS NOT NULL)),
    CHECK ((state = 'archived') = (published_at IS NOT NULL)),
    CHECK (state = 'archived' OR hot_deleted = 0)
) STRICT, WITHOUT ROWID;

-- Discovery walks buckets by state, oldest first.
CREATE INDEX pulpitum_v4_bucket_metadata_by_state
    ON pulpitum_v4_bucket_metadata (state, bucket_start);
