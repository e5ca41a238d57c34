-- See the PostgreSQL migration 0025: the processes that read this store.
CREATE TABLE pulpitum_v4_readers (
    reader_id     TEXT    NOT NULL PRIMARY KEY,
    role          TEXT    NOT NULL,
    build         TEXT    NOT NULL,
    record_schema INTEGER NOT NULL,
    schema_format INTEGER NOT NULL,
    seen_at       INTEGER NOT NULL -- microseconds since the Unix epoch, UTC
) STRICT;
