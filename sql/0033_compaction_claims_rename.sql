-- A fence against builds from before migration 29 that are still running. Such a build
-- switches buckets to a segment without recording the segment's route, and a listing across
-- partitions then misses those buckets. `Requires(29)` stops such a build only when it
-- starts; one started earlier keeps compacting. Every compaction and erasure repair of such
-- a build opens with a statement on the claims table by its old name, so renaming the table
-- makes those statements fail (SQLSTATE 42P01) before any route moves. Nothing else of an
-- older build uses the table: its archiving and queries carry on. `IF EXISTS` makes a second
-- run, or a racing migrator, a no-op.
ALTER TABLE IF EXISTS pulpitum_v4_compactions RENAME TO pulpitum_v4_compaction_claims
