-- Segment compaction's registry (see the PostgreSQL migrations 0010 and 0011 and
-- docs/segments.md, sections 5 to 7): window claims, which follow a bucket claim's protocol
-- without fencing any bucket, and the objects a route switch replaced, which GC deletes
-- only once the readers' route-cache bound has passed since their retirement. Times are
-- INTEGER microseconds since the Unix epoch (UTC). A released claim keeps its row (and
-- generation) with no owner and no lease.
CREATE TABLE pulpitum_v4_compactions (
    table_id         TEXT    NOT NULL,
    window_key       TEXT    NOT NULL,
    window_start     INTEGER NOT NULL,
    window_end       INTEGER NOT NULL,
    owner_token      TEXT,
    generation       INTEGER NOT NULL CHECK (generation >= 1),
    lease_expires_at INTEGER,
    updated_at       INTEGER NOT NULL,
    PRIMARY KEY (table_id, window_key),
    CHECK (window_start < window_end),
    CHECK ((owner_token IS NULL) = (lease_expires_at IS NULL))
) STRICT, WITHOUT ROWID;

CREATE TABLE pulpitum_v4_retired_objects (
    object_key TEXT    NOT NULL PRIMARY KEY,
    retired_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
