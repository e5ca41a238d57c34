-- See the PostgreSQL migrations 0026 and 0027: cleanup discovery's working set, and buckets by table
-- and end (retention, listings across partitions).
CREATE INDEX pulpitum_v4_bucket_metadata_cleanup
    ON pulpitum_v4_bucket_metadata (bucket_end)
    WHERE state = 'archived' AND hot_deleted = 0;

CREATE INDEX pulpitum_v4_bucket_metadata_by_end
    ON pulpitum_v4_bucket_metadata (table_id, bucket_end, partition_key);
