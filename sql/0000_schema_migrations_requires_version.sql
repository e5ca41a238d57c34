-- Bootstrap, second step (run after the ledger is created, never recorded): which builds may
-- still run once a migration is applied. 0 = additive (every build); N = only builds whose
-- schema version is at least N. NULL (rows recorded before this column existed) counts as
-- breaking for a version the reading build does not know, and is ignored for one it does.
ALTER TABLE pulpitum_v4_schema_migrations ADD COLUMN IF NOT EXISTS requires_version INT4 NULL
