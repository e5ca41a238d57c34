-- Migration 31 again, after the fence of migration 33: segments an older build switched to
-- between migration 29 and the fence have no route row, so listings across partitions would
-- miss their buckets. From here on no older build can switch, so this run finds every such
-- segment; each is recorded with its bucket count not known (-1), listed one by one.
-- Idempotent: segments already recorded are left as they are.
INSERT INTO pulpitum_v4_segment_routes (table_id, object_key, window_start, window_end, buckets)
SELECT table_id, object_key, min(bucket_start), max(bucket_end), -1
FROM pulpitum_v4_bucket_metadata
WHERE state = 'archived' AND object_key LIKE '%/segments/%/s_____-g%/manifest.json'
GROUP BY table_id, object_key
ON CONFLICT (table_id, object_key) DO NOTHING
