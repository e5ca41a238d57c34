-- Masks not rewritten yet, by partition: compaction's mask work reads only these, not the
-- masks kept (marked) for old routes until garbage collection forgets them.
CREATE INDEX IF NOT EXISTS pulpitum_v4_row_masks_unpurged
    ON pulpitum_v4_row_masks (table_id, partition_key, bucket_key)
    WHERE purged_at IS NULL
