-- The buckets not routed to a segment (hot, archiving, or archived in an object of their
-- own), by table and end: the part of a listing across every partition that segment routes
-- (migration 29) do not answer. Partial, so a table whose history sits in segments lists
-- its working set, not its history. Statements repeat the predicate verbatim.
CREATE INDEX IF NOT EXISTS pulpitum_v4_bucket_metadata_unsegmented
    ON pulpitum_v4_bucket_metadata (table_id, bucket_end)
    WHERE object_key IS NULL OR object_key NOT LIKE '%/segments/%/s_____-g%/manifest.json'
