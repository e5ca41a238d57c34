-- Retention writes jobs of kind 'retention' with outcome 'expired': the CHECKs of 0008 are
-- dropped and the build validates both columns when it reads them. PostgreSQL names a
-- column CHECK `<table>_<column>_check`; CockroachDB names it `check_<column>`: each
-- statement is a no-op on the other database.
ALTER TABLE pulpitum_v4_jobs DROP CONSTRAINT IF EXISTS pulpitum_v4_jobs_kind_check
