-- Per-table tiering policy. A table without a row keeps the archiver's settings. Durations
-- are whole microseconds (INT8) so both dialects compute `now() - archive_after` alike.
CREATE TABLE IF NOT EXISTS pulpitum_v4_policies (
    table_id TEXT NOT NULL PRIMARY KEY,
    archive_after_us INT8 NULL CHECK (archive_after_us IS NULL OR archive_after_us >= 0),
    payload_format TEXT NULL,
    cleanup_delay_us INT8 NULL CHECK (cleanup_delay_us IS NULL OR cleanup_delay_us >= 0),
    paused BOOL NOT NULL DEFAULT false,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
