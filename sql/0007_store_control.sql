-- Store-wide switches: one row (id = 1), absent until first set. `paused` stops new archive
-- claims on every table; cleanup of published buckets continues.
CREATE TABLE IF NOT EXISTS pulpitum_v4_store_control (
    id INT4 NOT NULL PRIMARY KEY CHECK (id = 1),
    paused BOOL NOT NULL DEFAULT false,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
