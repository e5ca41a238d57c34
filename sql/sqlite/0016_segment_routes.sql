-- See the PostgreSQL migrations 0029 to 0032: the segments of each table (one row per
-- segment manifest: its window and how many buckets it holds, -1 when not known), those
-- switched to before this table existed, and the buckets not routed to a segment. Times are
-- INTEGER microseconds since the Unix epoch (UTC).
CREATE TABLE pulpitum_v4_segment_routes (
    table_id     TEXT    NOT NULL,
    object_key   TEXT    NOT NULL,
    window_start INTEGER NOT NULL,
    window_end   INTEGER NOT NULL,
    buckets      INTEGER NOT NULL,
    PRIMARY KEY (table_id, object_key)
) STRICT, WITHOUT ROWID;

CREATE INDEX pulpitum_v4_segment_routes_by_end
    ON pulpitum_v4_segment_routes (table_id, window_end);

INSERT INTO pulpitum_v4_segment_routes (table_id, object_key, window_start, window_end, buckets)
SELECT table_id, object_key, min(bucket_start), max(bucket_end), -1
FROM pulpitum_v4_bucket_metadata
WHERE state = 'archived' AND object_key GLOB '*/segments/*/s?????-g*/manifest.json'
GROUP BY table_id, object_key;

CREATE INDEX pulpitum_v4_bucket_metadata_unsegmented
    ON pulpitum_v4_bucket_metadata (table_id, bucket_end)
    WHERE object_key IS NULL OR NOT (object_key GLOB '*/segments/*/s?????-g*/manifest.json');
