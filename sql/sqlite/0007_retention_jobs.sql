-- Retention writes jobs of kind 'retention' with outcome 'expired' (see the PostgreSQL
-- migrations 0014 to 0017). SQLite cannot change a CHECK in place: the table is rebuilt
-- with the wider CHECKs, inside the migration's transaction.
CREATE TABLE pulpitum_v4_jobs_v7 (
    table_id      TEXT    NOT NULL,
    partition_key BLOB    NOT NULL,
    bucket_key    TEXT    NOT NULL,
    generation    INTEGER NOT NULL,
    kind          TEXT    NOT NULL CHECK (kind IN ('archive', 'cleanup', 'retention')),
    worker        TEXT    NOT NULL,
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER,
    outcome       TEXT    NOT NULL CHECK (outcome IN ('running', 'published', 'cleaned',
        'deferred', 'lease_lost', 'failed', 'interrupted', 'abandoned', 'expired')),
    row_count     INTEGER,
    byte_count    INTEGER,
    error         TEXT,
    PRIMARY KEY (table_id, partition_key, bucket_key, generation)
) STRICT, WITHOUT ROWID;

INSERT INTO pulpitum_v4_jobs_v7 SELECT * FROM pulpitum_v4_jobs;

DROP TABLE pulpitum_v4_jobs;

ALTER TABLE pulpitum_v4_jobs_v7 RENAME TO pulpitum_v4_jobs;

CREATE INDEX pulpitum_v4_jobs_by_start ON pulpitum_v4_jobs (started_at);
