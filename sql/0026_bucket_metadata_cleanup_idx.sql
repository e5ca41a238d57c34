-- Cleanup discovery (published buckets whose hot rows are not yet deleted), which an
-- archiver runs every cycle. Partial, so it holds only that working set (a few buckets per
-- partition at most) however many buckets are archived and cleaned: without it the read
-- grows with every bucket ever archived (docs/registry-scale.md). The discovery statement
-- repeats the predicate verbatim.
CREATE INDEX IF NOT EXISTS pulpitum_v4_bucket_metadata_cleanup
    ON pulpitum_v4_bucket_metadata (bucket_end)
    WHERE state = 'archived' AND NOT hot_deleted;
