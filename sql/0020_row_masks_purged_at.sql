-- When a mask's rows were rewritten out of (or into, for an edit) the archive: the rewrite
-- that applied the mask switched the bucket to objects that no longer need it. The mask is
-- still applied by readers (harmlessly: the row is gone, or already holds the value) until
-- no reader can hold a route to the objects before the rewrite, then garbage collection
-- deletes it (docs/sql.md, "DELETE and UPDATE"). NULL: not rewritten yet, compaction has
-- work for the bucket's partition.
ALTER TABLE pulpitum_v4_row_masks ADD COLUMN IF NOT EXISTS purged_at TIMESTAMPTZ NULL
