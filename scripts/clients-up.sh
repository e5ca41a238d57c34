#!/usr/bin/env bash
# Installs the PostgreSQL clients the wire-server tests drive (tests/server.rs): psql (from
# Debian's postgresql-client, usually present beside the server), psycopg 3 (PyPI) and
# node-postgres (npm, into tests/clients/node_modules). Idempotent; quiet when all is there.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v psql >/dev/null; then
  echo "clients-up.sh: installing postgresql-client"
  apt-get install --no-install-recommends -y postgresql-client >/dev/null
fi
if ! python3 -c "import psycopg" 2>/dev/null; then
  echo "clients-up.sh: installing psycopg"
  python3 -m pip install --quiet --disable-pip-version-check 'psycopg[binary]>=3.2,<3.4'
fi
if ! python3 -c "import duckdb" 2>/dev/null; then
  # tests/declared.rs reads an archived payload of a declared table by column name with it.
  echo "clients-up.sh: installing duckdb"
  python3 -m pip install --quiet --disable-pip-version-check 'duckdb==2.0.1'
fi
if [ ! -d tests/clients/node_modules/pg ]; then
  echo "clients-up.sh: installing node-postgres"
  (cd tests/clients && npm install --no-audit --no-fund --silent)
fi
python3 -c "import psycopg; print('clients-up.sh: psycopg', psycopg.__version__)"
node -e "console.log('clients-up.sh: pg', require('./tests/clients/node_modules/pg/package.json').version)"
