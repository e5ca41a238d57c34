-- Row changes and retention (see the PostgreSQL migrations 0012 and 0013): delete and edit
-- records over archived rows, and a table's retention period in microseconds.
CREATE TABLE pulpitum_v4_row_masks (
    table_id      TEXT    NOT NULL,
    partition_key BLOB    NOT NULL,
    bucket_key    TEXT    NOT NULL,
    event_time    INTEGER NOT NULL,
    sort_key      BLOB    NOT NULL,
    kind          TEXT    NOT NULL CHECK (kind IN ('delete', 'edit')),
    value         BLOB,
    created_at    INTEGER NOT NULL,
    PRIMARY KEY (table_id, partition_key, bucket_key, event_time, sort_key),
    CHECK ((kind = 'edit') = (value IS NOT NULL))
) STRICT, WITHOUT ROWID;

ALTER TABLE pulpitum_v4_policies ADD COLUMN retain_for_us INTEGER;
