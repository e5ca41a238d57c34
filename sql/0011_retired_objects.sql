-- Objects a compaction's route switch replaced (docs/segments.md, sections 6 and 7). Orphan
-- GC measures an object's age from its creation, which is wrong for a per-bucket manifest
-- created months ago that became unreferenced at the switch: readers may still hold a
-- cached route to it. GC deletes a retired object only once `retired_at` (the database's
-- clock, the last switch that replaced it) is older than the route-cache bound plus the
-- clock-skew allowance, then deletes its row.
CREATE TABLE IF NOT EXISTS pulpitum_v4_retired_objects (
    object_key TEXT NOT NULL PRIMARY KEY,
    retired_at TIMESTAMPTZ NOT NULL
)
