-- The processes that read this store (shells, servers, archivers), each with the newest
-- record schema and table schema format it reads, refreshed while it runs. A change that
-- would store a version some live process cannot read is refused while that process is
-- live (docs/tables.md, "Compatibility between builds"). Older builds never read it.
CREATE TABLE IF NOT EXISTS pulpitum_v4_readers (
    reader_id     TEXT        NOT NULL PRIMARY KEY,
    role          TEXT        NOT NULL,
    build         TEXT        NOT NULL,
    record_schema INT4        NOT NULL,
    schema_format INT4        NOT NULL,
    seen_at       TIMESTAMPTZ NOT NULL
)
