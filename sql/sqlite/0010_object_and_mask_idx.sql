-- See the PostgreSQL migrations 0021 and 0022: buckets by the object they route to (work
-- of a retired segment, and whether a removed bucket's object is still routed to), and
-- masks not rewritten yet.
CREATE INDEX pulpitum_v4_bucket_metadata_by_object
    ON pulpitum_v4_bucket_metadata (object_key);

CREATE INDEX pulpitum_v4_row_masks_unpurged
    ON pulpitum_v4_row_masks (table_id, partition_key, bucket_key)
    WHERE purged_at IS NULL;
