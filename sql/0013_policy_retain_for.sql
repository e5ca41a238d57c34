-- Retention (`ALTER TABLE t SET (retain_for = '5 years')`): whole buckets that ended more
-- than this many microseconds before the store's now are removed by the archiver. NULL
-- keeps everything.
ALTER TABLE pulpitum_v4_policies ADD COLUMN IF NOT EXISTS retain_for_us INT8 NULL
