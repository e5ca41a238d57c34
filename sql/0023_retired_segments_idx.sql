-- The retired objects that are segments. Every switch also retires the per-bucket objects
-- it replaced (thousands a month, kept for the retirement delay), but only a segment can
-- still be routed to by other buckets once retired: compaction's retired-route work starts
-- from this index, so its cost follows the retired segments, not the retired objects.
CREATE INDEX IF NOT EXISTS pulpitum_v4_retired_objects_segments
    ON pulpitum_v4_retired_objects (object_key)
    WHERE object_key LIKE '%/segments/%/s_____-g%/manifest.json'
