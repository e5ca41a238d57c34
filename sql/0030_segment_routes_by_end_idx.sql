-- Segments by table and window end: a listing's segments are those whose window ends after
-- its start (and starts before its end).
CREATE INDEX IF NOT EXISTS pulpitum_v4_segment_routes_by_end
    ON pulpitum_v4_segment_routes (table_id, window_end)
