-- See the PostgreSQL migration 0028: the directories orphan GC lists on most passes.
-- `recorded_at` is INTEGER microseconds since the Unix epoch (UTC), the store's clock.
CREATE TABLE pulpitum_v4_gc_prefixes (
    prefix      TEXT    NOT NULL PRIMARY KEY,
    recorded_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
