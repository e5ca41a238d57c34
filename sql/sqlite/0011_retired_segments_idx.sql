-- See the PostgreSQL migration 0023: the retired objects that are segments.
CREATE INDEX pulpitum_v4_retired_objects_segments
    ON pulpitum_v4_retired_objects (object_key)
    WHERE object_key GLOB '*/segments/*/s?????-g*/manifest.json';
