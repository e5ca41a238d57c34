-- See the PostgreSQL migration 0024: the schema versions of declared tables.
CREATE TABLE pulpitum_v4_table_schemas (
    table_id       TEXT    NOT NULL,
    schema_version INTEGER NOT NULL,
    definition     TEXT    NOT NULL,
    created_at     INTEGER NOT NULL, -- microseconds since the Unix epoch, UTC
    PRIMARY KEY (table_id, schema_version)
) STRICT;
