-- Bootstrap (applied by the runner before any numbered migration, never recorded): the
-- ledger of applied migrations. One row per version; the checksum is the SHA-256 of the
-- migration file as shipped, so an edited migration is detected and refused.
CREATE TABLE IF NOT EXISTS pulpitum_v4_schema_migrations (
    version INT4 NOT NULL PRIMARY KEY,
    name TEXT NOT NULL,
    checksum TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
