-- The same work list by start (see 0018): the next due window of a table is its first entry
-- at or after a cursor.
CREATE INDEX IF NOT EXISTS pulpitum_v4_bucket_metadata_to_compact_by_start
    ON pulpitum_v4_bucket_metadata (table_id, bucket_start)
    WHERE state = 'archived' AND hot_deleted AND object_key NOT LIKE '%/segments/%/s_____-g%/manifest.json'
