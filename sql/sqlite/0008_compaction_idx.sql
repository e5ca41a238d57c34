-- Compaction's work list (see the PostgreSQL migrations 0018 and 0019): archived, cleaned
-- buckets still routed to a per-bucket object, by partition and by start. GLOB, not LIKE:
-- SQLite's LIKE ignores case. Statements repeat the predicate verbatim, which is what lets
-- SQLite's planner use a partial index.
CREATE INDEX pulpitum_v4_bucket_metadata_to_compact
    ON pulpitum_v4_bucket_metadata (table_id, partition_key, bucket_start)
    WHERE state = 'archived' AND hot_deleted = 1 AND NOT (object_key GLOB '*/segments/*/s?????-g*/manifest.json');

CREATE INDEX pulpitum_v4_bucket_metadata_to_compact_by_start
    ON pulpitum_v4_bucket_metadata (table_id, bucket_start)
    WHERE state = 'archived' AND hot_deleted = 1 AND NOT (object_key GLOB '*/segments/*/s?????-g*/manifest.json');
