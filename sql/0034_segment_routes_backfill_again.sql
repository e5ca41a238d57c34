-- Migration 31 again, after the fence of migration 33: segments an older build switched to
-- between migration 29 and the fence have no route row, so listings across partitions would
-- miss their buckets. From here on no older build can switch, so this run finds every such
-- segment; each is recorded with its bucket count not known (-1), listed one by one.
-- A segment recorded already keeps its count, and its window is widened to every bucket
-- routed to it now: such a build's erasure repair may have routed to a recorded segment a
-- bucket outside the window migration 31 saw, which a listing would otherwise never look
-- for there. Idempotent: a second run finds every window as wide as its buckets.
INSERT INTO pulpitum_v4_segment_routes AS s
  (table_id, object_key, window_start, window_end, buckets)
SELECT table_id, object_key, min(bucket_start), max(bucket_end), -1
FROM pulpitum_v4_bucket_metadata
WHERE state = 'archived' AND object_key LIKE '%/segments/%/s_____-g%/manifest.json'
GROUP BY table_id, object_key
ON CONFLICT (table_id, object_key) DO UPDATE SET
  window_start = LEAST(s.window_start, excluded.window_start),
  window_end = GREATEST(s.window_end, excluded.window_end)
