-- Where objects no route names may be left (docs/archiver.md, "Garbage collection"): a
-- bucket claim's generation directory, noted before its upload, and a window's segments
-- directory, noted before a compaction writes there. Orphan GC lists only these (and the
-- directories of retired objects due for deletion) on most passes, so a pass costs what it
-- may delete, not a listing of the whole archive; a full listing still runs at an
-- archiver's start and daily. A row is forgotten once its directory holds nothing GC must
-- wait for (a publication forgets its own at once); `recorded_at` is the store's clock,
-- refreshed by every noting, and a row is forgotten only if it was not refreshed since GC
-- read it.
CREATE TABLE IF NOT EXISTS pulpitum_v4_gc_prefixes (
    prefix TEXT NOT NULL PRIMARY KEY,
    recorded_at TIMESTAMPTZ NOT NULL
)
