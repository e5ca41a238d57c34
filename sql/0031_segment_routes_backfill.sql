-- The segments switched to before migration 29, from the buckets routed to them. Their
-- manifests' bucket counts are not in the registry, so they are recorded as not known (-1):
-- their buckets are listed one by one, as before, until a later switch to the same segment
-- records the count. Idempotent: a second run finds every row present.
INSERT INTO pulpitum_v4_segment_routes (table_id, object_key, window_start, window_end, buckets)
SELECT table_id, object_key, min(bucket_start), max(bucket_end), -1
FROM pulpitum_v4_bucket_metadata
WHERE state = 'archived' AND object_key LIKE '%/segments/%/s_____-g%/manifest.json'
GROUP BY table_id, object_key
ON CONFLICT (table_id, object_key) DO NOTHING
