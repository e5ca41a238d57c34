-- Compaction's work list: archived, cleaned buckets still routed to a per-bucket object (a
-- segment manifest's key matches the pattern; see `SEGMENT_KEY_LIKE`). Partial, so it holds
-- only buckets compaction has yet to move, however many sit in segments already: finding
-- the next due window is one probe, and listing a window's partitions that need work reads
-- only those (docs/segments.md, "Finding work"). Statements repeat the predicate verbatim;
-- CockroachDB and PostgreSQL use a partial index only when the query implies it.
CREATE INDEX IF NOT EXISTS pulpitum_v4_bucket_metadata_to_compact
    ON pulpitum_v4_bucket_metadata (table_id, partition_key, bucket_start)
    WHERE state = 'archived' AND hot_deleted AND object_key NOT LIKE '%/segments/%/s_____-g%/manifest.json'
