"""psycopg 3 against `pulpitum serve`: server-side prepared statements with binary results.

Run by tests/server.rs with the port as the first argument and the password in PGPASSWORD.
Exits non-zero with the failing check on stderr.
"""
import datetime as dt
import os
import sys

import psycopg

port = sys.argv[1]
conn = psycopg.connect(
    host="127.0.0.1", port=port, user="alice", dbname="pulpitum",
    password=os.environ["PGPASSWORD"], sslmode="disable", autocommit=True,
)
UTC = dt.timezone.utc

# Keyset paging across the hot/archive seam, server-side prepared, binary results.
page = (
    "SELECT timestamp, id, content FROM chat WHERE channel_id = %s "
    "AND (timestamp < %s OR (timestamp = %s AND id < %s)) "
    "ORDER BY timestamp DESC, id DESC LIMIT 4"
)
cursor = (dt.datetime(2100, 1, 1, tzinfo=UTC), 0)
seen = []
with conn.cursor(binary=True) as cur:
    while True:
        cur.execute(page, (1, cursor[0], cursor[0], cursor[1]), prepare=True)
        rows = cur.fetchall()
        if not rows:
            break
        for ts, ident, content in rows:
            assert content == f"day {ident}", (ident, content)
            assert ts.microsecond == 123456, ts
            assert ts.tzinfo is not None, ts
            seen.append(ident)
            cursor = (ts, ident)
assert seen == list(range(31, 0, -1)), seen

# Types round-trip: BIGINT extremes, microsecond TIMESTAMPTZ, UTF-8 text.
with conn.cursor(binary=True) as cur:
    cur.execute(
        "SELECT id, timestamp, content FROM chat WHERE channel_id = %s ORDER BY id",
        (3,), prepare=True,
    )
    got = cur.fetchall()
assert got == [
    (-(2**63), dt.datetime(2024, 1, 31, 0, 0, 0, 1, tzinfo=UTC), "kleinste"),
    (2**63 - 1, dt.datetime(2024, 1, 31, 23, 59, 59, 999999, tzinfo=UTC), "größte ✓"),
], got

# A parameter of every column type, text results this time.
with conn.cursor() as cur:
    cur.execute(
        "SELECT count(*) FROM chat WHERE channel_id = %s AND timestamp = %s AND id = %s "
        "AND content = %s",
        (3, dt.datetime(2024, 1, 31, 23, 59, 59, 999999, tzinfo=UTC), 2**63 - 1, "größte ✓"),
    )
    assert cur.fetchone() == (1,)
    # The control plane through the driver.
    cur.execute("SELECT count(*) FROM pulpitum_buckets WHERE state = %s", ("archived",))
    assert cur.fetchone() == (52,)
    # A missing table is SQLSTATE 42P01 in the driver's exception.
    try:
        cur.execute("SELECT * FROM nope")
        raise AssertionError("a missing table was answered")
    except psycopg.errors.UndefinedTable:
        pass
# A server-side cursor: psycopg declares it, then fetches over the extended protocol,
# whose Describe must give the cursor's columns (it answered NoData, and psycopg failed).
with conn.transaction():
    with conn.cursor(name="pages") as cur:
        cur.execute("SELECT id, content FROM chat WHERE channel_id = 1 ORDER BY id")
        first = cur.fetchmany(10)
        assert [r[0] for r in first] == list(range(1, 11)), first
        assert first[0][1] == "day 1", first
        assert [d.name for d in cur.description] == ["id", "content"], cur.description
        rest = cur.fetchall()
        assert [r[0] for r in rest] == list(range(11, 32)), rest
print("psycopg ok")
