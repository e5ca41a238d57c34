-- See the PostgreSQL migrations 33 and 34: the claims table renamed, so that a build from
-- before segment routes still running on this file fails its compactions instead of
-- switching buckets to a segment without recording it; then the segments such a build
-- switched to before the rename, recorded with their bucket counts not known (-1), and the
-- windows of recorded segments widened to every bucket routed to them.
ALTER TABLE pulpitum_v4_compactions RENAME TO pulpitum_v4_compaction_claims;

INSERT INTO pulpitum_v4_segment_routes AS s
  (table_id, object_key, window_start, window_end, buckets)
SELECT table_id, object_key, min(bucket_start), max(bucket_end), -1
FROM pulpitum_v4_bucket_metadata
WHERE state = 'archived' AND object_key GLOB '*/segments/*/s?????-g*/manifest.json'
GROUP BY table_id, object_key
ON CONFLICT (table_id, object_key) DO UPDATE SET
  window_start = min(s.window_start, excluded.window_start),
  window_end = max(s.window_end, excluded.window_end);
