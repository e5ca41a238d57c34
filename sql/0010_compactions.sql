-- Segment compaction's window claims (docs/segments.md, section 5): one row per window of a
-- table that was ever claimed. A window is claimed like a bucket, with a fresh owner token,
-- generation + 1 and a lease on the database's clock, but in its own table: compaction
-- reads buckets that are already archived and immutable, so it never fences one. The
-- generation names the segment objects, so two compactors of one window never write the
-- same key. A released claim keeps its row (and generation) with no owner and no lease.
CREATE TABLE IF NOT EXISTS pulpitum_v4_compactions (
    table_id TEXT NOT NULL,
    window_key TEXT NOT NULL,
    window_start TIMESTAMPTZ NOT NULL,
    window_end TIMESTAMPTZ NOT NULL,
    owner_token TEXT NULL,
    generation INT8 NOT NULL CHECK (generation >= 1),
    lease_expires_at TIMESTAMPTZ NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (table_id, window_key),
    CHECK (window_start < window_end),
    CHECK ((owner_token IS NULL) = (lease_expires_at IS NULL))
)
