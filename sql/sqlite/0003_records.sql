-- Hot records, clustered by their physical identity so that a bucket's rows are one
-- contiguous, ordered key range (WITHOUT ROWID stores the table as that B-tree).
-- Keys are BLOBs; SQLite compares BLOBs bytewise, matching the model's ordering.
CREATE TABLE pulpitum_v4_records (
    table_id      TEXT    NOT NULL,
    partition_key BLOB    NOT NULL,
    bucket_key    TEXT    NOT NULL,
    event_time    INTEGER NOT NULL,
    sort_key      BLOB    NOT NULL,
    value         BLOB    NOT NULL,
    PRIMARY KEY (table_id, partition_key, bucket_key, event_time, sort_key)
) STRICT, WITHOUT ROWID;
