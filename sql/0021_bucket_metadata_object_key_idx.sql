-- Buckets by the object they route to. A compaction that moves some partitions out of a
-- segment retires it while other partitions still route to it; those partitions are then
-- compaction work (their rows, and the removed rows beside them, must leave the old
-- object before it can be deleted), found by joining the retired objects to this index.
-- Retention asks the same question when it removes a bucket: an object is retired only
-- once no bucket routes to it (docs/segments.md, "Finding work").
CREATE INDEX IF NOT EXISTS pulpitum_v4_bucket_metadata_by_object
    ON pulpitum_v4_bucket_metadata (object_key)
