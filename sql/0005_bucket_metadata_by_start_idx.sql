-- A partition's buckets in time order: reads list the newest (or oldest) few of a long
-- history without sorting all of them, and listings come out in their reading order.
CREATE INDEX IF NOT EXISTS pulpitum_v4_bucket_metadata_by_start
    ON pulpitum_v4_bucket_metadata (table_id, partition_key, bucket_start)
