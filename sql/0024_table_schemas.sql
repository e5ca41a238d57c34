-- The schema versions of declared tables (record schema v3): one row per version, the
-- definition as JSON (src/model/schema). A change inserts the next version; the primary key
-- makes two concurrent changes of one table race for it, and one of them is refused.
CREATE TABLE IF NOT EXISTS pulpitum_v4_table_schemas (
    table_id       TEXT        NOT NULL,
    schema_version INT4        NOT NULL,
    definition     TEXT        NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (table_id, schema_version)
)
