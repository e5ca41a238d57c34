-- The segments of each table, one row per segment manifest, written by the transaction that
-- switches buckets to it: the window its buckets lie in and how many buckets its manifest
-- holds (-1: not known, for segments switched before this table existed). A listing across
-- every partition of a table reads these instead of one route per (partition, bucket): a
-- segment whose manifest's buckets are all still routed to it (as many routed buckets as it
-- holds) is read from its manifest, and only the buckets not routed to such a segment are
-- listed one by one (docs/segments.md, "Listing across partitions").
CREATE TABLE IF NOT EXISTS pulpitum_v4_segment_routes (
    table_id     TEXT        NOT NULL,
    object_key   TEXT        NOT NULL,
    window_start TIMESTAMPTZ NOT NULL,
    window_end   TIMESTAMPTZ NOT NULL,
    buckets      INT8        NOT NULL,
    PRIMARY KEY (table_id, object_key)
)
