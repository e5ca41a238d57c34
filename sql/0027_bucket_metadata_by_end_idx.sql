-- Buckets by table, then end: retention's expired buckets (a table's buckets that ended
-- before a bound, oldest first, a page at a time, read every cycle) and listings across
-- every partition of a table over a short time range (a one-day query across channels).
-- Entries of one (table, day) share a key, so B-tree deduplication keeps it small (with the
-- partition in the key it cost 82 bytes more per bucket, docs/benchmarks.md).
CREATE INDEX IF NOT EXISTS pulpitum_v4_bucket_metadata_by_end
    ON pulpitum_v4_bucket_metadata (table_id, bucket_end);
