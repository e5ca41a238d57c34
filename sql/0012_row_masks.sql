-- Delete and edit records over archived rows (docs/sql.md, "DELETE and UPDATE"). Archived
-- objects are immutable, so a DELETE or UPDATE of an archived row writes one row here, in
-- the transaction that answers the client, and every archived read applies it. Keyed like
-- a hot row, so a bucket's records are one contiguous range. An edit carries the new body;
-- a delete carries none. Rows are removed with their bucket (retention) or, later, by the
-- rewrite that retires the objects.
CREATE TABLE IF NOT EXISTS pulpitum_v4_row_masks (
    table_id TEXT NOT NULL,
    partition_key BYTEA NOT NULL,
    bucket_key TEXT NOT NULL,
    event_time TIMESTAMPTZ NOT NULL,
    sort_key BYTEA NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('delete', 'edit')),
    value BYTEA NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (table_id, partition_key, bucket_key, event_time, sort_key),
    CHECK ((kind = 'edit') = (value IS NOT NULL))
)
