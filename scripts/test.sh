#!/usr/bin/env bash
# Runs every test on a fresh machine: checks (and if needed starts) PostgreSQL, installs and
# starts a throwaway S3 server (Ceph radosgw), then formats, lints and tests the crate.
#   bash scripts/test.sh            # everything
#   bash scripts/test.sh --lib      # extra arguments go to `cargo test` (before its `--`)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  echo "test.sh: PostgreSQL is not answering on 127.0.0.1:5432; starting it"
  if command -v pg_ctlcluster >/dev/null; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start
  else
    echo "test.sh: no PostgreSQL installation found (apt-get install postgresql)" >&2
    exit 1
  fi
  for _ in $(seq 1 60); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.5; done
fi
psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 \
  || psql -h 127.0.0.1 -U postgres -d postgres -c "CREATE DATABASE test"

# Tests create a schema each in database `test` (prefixes arch_, pulpitum_test_, sqlt_), and
# tests/privileges.rs roles (prefix pulpitum_test_); a test that panics or is killed leaves
# them behind. Sweep them before the run, and
# after it when everything passed (a failed run keeps its schemas for a post-mortem).
sweep_test_schemas() {
  # One statement per schema (\gexec runs each in its own transaction): dropping hundreds
  # of schemas in one transaction runs out of PostgreSQL's lock table.
  psql -h 127.0.0.1 -U postgres -d test -qAt -v ON_ERROR_STOP=1 <<'SQL'
SET client_min_messages = warning;
SELECT format('DROP SCHEMA %I CASCADE', nspname) FROM pg_namespace
 WHERE nspname LIKE 'arch\_%' OR nspname LIKE 'pulpitum\_test\_%' OR nspname LIKE 'sqlt\_%'
\gexec
-- Roles of tests/privileges.rs (their schemas are arch_ ones, dropped above).
SELECT format('DROP OWNED BY %I', rolname) FROM pg_roles WHERE rolname LIKE 'pulpitum\_test\_%'
\gexec
SELECT format('DROP ROLE %I', rolname) FROM pg_roles WHERE rolname LIKE 'pulpitum\_test\_%'
\gexec
SQL
}
sweep_test_schemas

# A half-started cluster (a daemon of an earlier run still exiting) is torn down and started
# again once; s3-up.sh stops leftovers under its state folder before it starts.
bash scripts/s3-up.sh || { echo "test.sh: S3 did not start; retrying once"; sleep 3; bash scripts/s3-up.sh; }
# The PostgreSQL clients the wire-server tests drive (psql, psycopg, node-postgres).
bash scripts/clients-up.sh

cargo fmt --all -- --check
cargo clippy --all-targets --features failpoints -- -D warnings
cargo test --features failpoints --no-fail-fast "$@" -- --skip archivers_survive_kills_faults_and_dropped_connections
# The chaos test prints its figures (buckets, rows, kills, faults, anomalies): let them show.
cargo test --features failpoints --test archiver_chaos -- --nocapture
sweep_test_schemas
