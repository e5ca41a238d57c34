-- Work discovery scans buckets by state, oldest bucket_end first.
CREATE INDEX IF NOT EXISTS pulpitum_v4_bucket_metadata_discovery
    ON pulpitum_v4_bucket_metadata (state, bucket_end)
