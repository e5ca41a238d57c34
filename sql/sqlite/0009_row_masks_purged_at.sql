-- See the PostgreSQL migration 0020: when a mask's rows were rewritten (store microseconds),
-- NULL while compaction still has work for it.
ALTER TABLE pulpitum_v4_row_masks ADD COLUMN purged_at INTEGER;
