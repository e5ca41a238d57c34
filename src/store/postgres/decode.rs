//! Decoding rows of the PostgreSQL store into the store's types: table definitions, bucket
//! metadata and routes, records, and pages straight into envelope batches.
//!
//! Timestamps are read from the binary wire format as microseconds ([`PgMicros`]) and
//! columns by position, because both showed up in a hot page's client time. Everything read
//! is validated (keys, bounds against their bucket key, state names, array lengths): a row
//! that does not decode is [`StoreError::Corrupt`], never a wrong answer.

use chrono::{DateTime, Utc};
use datafusion::arrow::record_batch::RecordBatch;
use tokio_postgres::Row;

use super::sql::meta_col;
use crate::model::{
    BucketId, BucketKey, BucketStrategy, EnvelopeBuilder, EventTime, PartitionKey, Record, SortKey,
    TableId,
};
use crate::store::{
    BucketMeta, BucketState, PageRequest, RoutedBucket, StoreError, StoreResult, TableDefinition,
};

pub(super) fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {e}"))
}

pub(super) fn event_time(dt: DateTime<Utc>, what: &str) -> StoreResult<EventTime> {
    EventTime::from_datetime(dt).map_err(|e| corrupt(what, e))
}

pub(super) fn decode_table(row: &Row) -> StoreResult<TableDefinition> {
    let get = |e: tokio_postgres::Error| corrupt("table registry row", e);
    let id: String = row.try_get(0).map_err(get)?;
    let strategy: String = row.try_get(1).map_err(get)?;
    let writable: Option<i32> = row.try_get(2).map_err(get)?;
    let version: i32 = row.try_get(3).map_err(get)?;
    let surface: String = row.try_get(4).map_err(get)?;
    let writable_buckets = match writable {
        None => None,
        Some(n) => Some(u32::try_from(n).map_err(|_| corrupt("writable_buckets", n))?),
    };
    Ok(TableDefinition {
        table_id: TableId::new(id).map_err(|e| corrupt("table id", e))?,
        strategy: strategy
            .parse::<BucketStrategy>()
            .map_err(|e| corrupt("bucket strategy", e))?,
        writable_buckets,
        record_schema_version: version,
        surface,
    })
}

/// A `TIMESTAMPTZ` (or `TIMESTAMP`) read as microseconds since the Unix epoch, straight from
/// the binary wire format (an i64 of microseconds since 2000-01-01, on PostgreSQL and on
/// CockroachDB alike). The row decoders of the read paths use it instead of chrono's calendar
/// arithmetic, which took a measurable share of a hot page's client time; the range check is
/// [`EventTime::from_micros`]'s, as before.
struct PgMicros(i64);

/// 2000-01-01T00:00:00Z, PostgreSQL's timestamp epoch, in Unix microseconds.
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

impl<'a> tokio_postgres::types::FromSql<'a> for PgMicros {
    fn from_sql(
        _: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let bytes: [u8; 8] = raw
            .try_into()
            .map_err(|_| format!("a timestamp of {} bytes, not 8", raw.len()))?;
        // Infinity is i64::MAX/MIN on the wire: out of range here, then refused by the
        // event time's range check.
        i64::from_be_bytes(bytes)
            .checked_add(PG_EPOCH_MICROS)
            .map(PgMicros)
            .ok_or_else(|| "an infinite timestamp".into())
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        use tokio_postgres::types::Type;
        *ty == Type::TIMESTAMPTZ || *ty == Type::TIMESTAMP
    }
}

fn micros_time(t: PgMicros, what: &str) -> StoreResult<EventTime> {
    EventTime::from_micros(t.0).map_err(|e| corrupt(what, e))
}

/// One bucket metadata row's fields, however the statement delivered them.
struct MetaParts<'a> {
    table_id: &'a str,
    partition_key: &'a [u8],
    key: &'a str,
    strategy: &'a str,
    start: PgMicros,
    end: PgMicros,
    state: &'a str,
    owner_token: Option<&'a str>,
    generation: i64,
    lease: Option<PgMicros>,
    retry: Option<PgMicros>,
    object_key: Option<&'a str>,
    hot_deleted: bool,
    published: Option<PgMicros>,
}

pub(super) fn decode_meta(row: &Row) -> StoreResult<BucketMeta> {
    use meta_col as c;
    let get = |e: tokio_postgres::Error| corrupt("bucket metadata row", e);
    MetaParts {
        table_id: row.try_get(c::TABLE_ID).map_err(get)?,
        partition_key: row.try_get(c::PARTITION_KEY).map_err(get)?,
        key: row.try_get(c::BUCKET_KEY).map_err(get)?,
        strategy: row.try_get(c::STRATEGY).map_err(get)?,
        start: row.try_get(c::START).map_err(get)?,
        end: row.try_get(c::END).map_err(get)?,
        state: row.try_get(c::STATE).map_err(get)?,
        owner_token: row.try_get(c::OWNER).map_err(get)?,
        generation: row.try_get(c::GENERATION).map_err(get)?,
        lease: row.try_get(c::LEASE).map_err(get)?,
        retry: row.try_get(c::RETRY).map_err(get)?,
        object_key: row.try_get(c::OBJECT_KEY).map_err(get)?,
        hot_deleted: row.try_get(c::HOT_DELETED).map_err(get)?,
        published: row.try_get(c::PUBLISHED).map_err(get)?,
    }
    .decode()
}

/// The bucket of the head statement
/// ([`RoutedReads::read_head`](crate::store::RoutedReads::read_head)) from its first row:
/// key, state, object key, cleanup flag and start (checked against the key); the table and
/// partition are the ones the statement filtered on.
pub(super) fn decode_routed(
    row: &Row,
    table_id: &TableId,
    partition: &PartitionKey,
) -> StoreResult<RoutedBucket> {
    let get = |e: tokio_postgres::Error| corrupt("bucket metadata row", e);
    let key: &str = row.try_get(0).map_err(get)?;
    let bucket_key = BucketKey::parse_any(key).map_err(|e| corrupt("bucket key", e))?;
    let start: PgMicros = row.try_get(4).map_err(get)?;
    if bucket_key.start().as_micros() != start.0 {
        return Err(StoreError::Corrupt(format!(
            "bucket {key} is stored with a start ({} µs) that does not match its key",
            start.0
        )));
    }
    let id = BucketId {
        table_id: table_id.clone(),
        partition_key: partition.clone(),
        bucket_key,
    };
    let state = decode_state(
        &id,
        row.try_get(1).map_err(get)?,
        row.try_get(2).map_err(get)?,
        row.try_get(3).map_err(get)?,
    )?;
    Ok(RoutedBucket { id, state })
}

/// A bucket's state from its stored columns.
fn decode_state(
    id: &BucketId,
    state: &str,
    object_key: Option<&str>,
    hot_deleted: bool,
) -> StoreResult<BucketState> {
    Ok(match state {
        "hot" => BucketState::Hot,
        "archiving" => BucketState::Archiving,
        "archived" => BucketState::Archived {
            object_key: object_key
                .ok_or_else(|| {
                    StoreError::Corrupt(format!("archived bucket {id} has no object key"))
                })?
                .to_string(),
            hot_deleted,
        },
        other => {
            return Err(StoreError::Corrupt(format!(
                "bucket {id} has unknown state {other:?}"
            )))
        }
    })
}

impl MetaParts<'_> {
    fn decode(self) -> StoreResult<BucketMeta> {
        let (start, end, key) = (self.start.0, self.end.0, self.key);
        let strategy: BucketStrategy = self
            .strategy
            .parse()
            .map_err(|e| corrupt("bucket strategy", e))?;
        let bucket_key = BucketKey::parse(strategy, key).map_err(|e| corrupt("bucket key", e))?;
        if (bucket_key.start().as_micros(), bucket_key.end().as_micros()) != (start, end) {
            let show = |t: i64| {
                EventTime::from_micros(t).map_or_else(|_| format!("{t} µs"), |t| t.to_string())
            };
            return Err(StoreError::Corrupt(format!(
                "bucket {key} is stored with bounds [{}, {}) that do not match its key",
                show(start),
                show(end)
            )));
        }
        let id = BucketId {
            table_id: TableId::new(self.table_id).map_err(|e| corrupt("table id", e))?,
            partition_key: PartitionKey::new(self.partition_key.to_vec())
                .map_err(|e| corrupt("partition key", e))?,
            bucket_key,
        };
        let state = decode_state(&id, self.state, self.object_key, self.hot_deleted)?;
        let opt_time =
            |t: Option<PgMicros>, what: &str| t.map(|t| micros_time(t, what)).transpose();
        Ok(BucketMeta {
            state,
            generation: self.generation,
            owner_token: self.owner_token.map(str::to_string),
            lease_expires_at: opt_time(self.lease, "lease_expires_at")?,
            retry_at: opt_time(self.retry, "retry_at")?,
            published_at: opt_time(self.published, "published_at")?,
            id,
        })
    }
}

/// A record row's fields, borrowed from the row.
struct Borrowed<'a> {
    time: EventTime,
    sort: &'a [u8],
    value: &'a [u8],
}

/// Decodes and validates `(event_time, sort_key, value)` at columns `at..at+3` without
/// copying; `None` for a row whose `event_time` is NULL (the NULL row of a LEFT JOIN that
/// matched nothing). `value` is empty unless `with_value`.
fn borrow_record(row: &Row, at: usize, with_value: bool) -> StoreResult<Option<Borrowed<'_>>> {
    let get = |e: tokio_postgres::Error| corrupt("record row", e);
    let Some(t) = row.try_get::<_, Option<PgMicros>>(at).map_err(get)? else {
        return Ok(None);
    };
    let sort: Option<&[u8]> = row.try_get(at + 1).map_err(get)?;
    let sort = sort.ok_or_else(|| StoreError::Corrupt("record without sort key".into()))?;
    SortKey::check(sort).map_err(|e| corrupt("sort key", e))?;
    let value: &[u8] = if with_value {
        let value: Option<&[u8]> = row.try_get(at + 2).map_err(get)?;
        value.ok_or_else(|| StoreError::Corrupt("record without value".into()))?
    } else {
        &[]
    };
    Ok(Some(Borrowed {
        time: micros_time(t, "event_time")?,
        sort,
        value,
    }))
}

/// Decodes `(event_time, sort_key, value)` at columns `at..at+3` into a record; `None` for
/// the NULL row of a LEFT JOIN that matched nothing.
pub(super) fn decode_record(
    row: &Row,
    at: usize,
    partition_key: &PartitionKey,
    with_value: bool,
) -> StoreResult<Option<Record>> {
    let Some(r) = borrow_record(row, at, with_value)? else {
        return Ok(None);
    };
    Ok(Some(Record {
        partition_key: partition_key.clone(),
        event_time: r.time,
        sort_key: SortKey::new(r.sort.to_vec()).map_err(|e| corrupt("sort key", e))?,
        value: r.value.to_vec(),
    }))
}

/// Puts rows in clustering order (reversed when `descending`). The statement reads them in
/// index order, so this is a check in one pass; a statement is not promised to keep a
/// branch's order, so the fallback sorts.
fn in_page_order(rows: &mut [Borrowed<'_>], descending: bool) {
    fn key<'a>(r: &Borrowed<'a>) -> (EventTime, &'a [u8]) {
        (r.time, r.sort)
    }
    let ordered = if descending {
        rows.is_sorted_by(|a, b| key(a) >= key(b))
    } else {
        rows.is_sorted_by(|a, b| key(a) <= key(b))
    };
    if !ordered {
        rows.sort_by(|a, b| key(a).cmp(&key(b)));
        if descending {
            rows.reverse();
        }
    }
}

/// Decodes a page aggregated into arrays (`event_time`, `sort_key` and `value` at columns
/// `at..at+3`, all NULL when no row matched; `value` read only when the page includes it)
/// straight into one envelope batch in the page's order, borrowing the bytes from the row:
/// no record is built on the way. Arrays of different lengths, NULL elements, sort keys
/// that are not valid keys and times out of range are reported as corrupt.
pub(super) fn decode_envelope(
    row: &Row,
    at: usize,
    partition: &PartitionKey,
    page: &PageRequest,
) -> StoreResult<RecordBatch> {
    let get = |e: tokio_postgres::Error| corrupt("record arrays", e);
    let times: Option<Vec<PgMicros>> = row.try_get(at).map_err(get)?;
    let sorts: Option<Vec<&[u8]>> = row.try_get(at + 1).map_err(get)?;
    let values: Option<Vec<&[u8]>> = if page.include_value {
        row.try_get(at + 2).map_err(get)?
    } else {
        None
    };
    let (times, sorts) = (times.unwrap_or_default(), sorts.unwrap_or_default());
    let lengths_agree = sorts.len() == times.len()
        && values
            .as_ref()
            .map_or(!page.include_value || times.is_empty(), |v| {
                v.len() == times.len()
            });
    if !lengths_agree {
        return Err(StoreError::Corrupt(format!(
            "record arrays of different lengths: {} times, {} sort keys, {} values",
            times.len(),
            sorts.len(),
            values.as_ref().map_or(0, Vec::len)
        )));
    }
    let mut out: Vec<Borrowed<'_>> = Vec::with_capacity(times.len());
    let mut bytes = 0;
    for (i, (time, sort)) in times.into_iter().zip(sorts).enumerate() {
        SortKey::check(sort).map_err(|e| corrupt("sort key", e))?;
        let value = values.as_ref().map_or(&[][..], |v| v[i]);
        bytes += value.len();
        out.push(Borrowed {
            time: micros_time(time, "event_time")?,
            sort,
            value,
        });
    }
    in_page_order(&mut out, page.descending);
    let mut batch = EnvelopeBuilder::with_capacity(out.len(), bytes, page.include_value);
    for r in &out {
        batch.push(partition.as_bytes(), r.time, r.sort, r.value);
    }
    Ok(batch.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_rows_are_put_in_clustering_order_either_way() {
        let t = |m: i64| EventTime::from_micros(m).unwrap();
        let rows = || {
            vec![
                Borrowed {
                    time: t(2),
                    sort: b"a",
                    value: b"2a",
                },
                Borrowed {
                    time: t(1),
                    sort: b"z",
                    value: b"1z",
                },
                Borrowed {
                    time: t(2),
                    sort: b"",
                    value: b"2",
                },
                Borrowed {
                    time: t(3),
                    sort: b"b",
                    value: b"3b",
                },
            ]
        };
        fn values<'a>(rs: &[Borrowed<'a>]) -> Vec<&'a [u8]> {
            rs.iter().map(|r| r.value).collect()
        }
        let mut asc = rows();
        in_page_order(&mut asc, false);
        assert_eq!(values(&asc), [b"1z".as_ref(), b"2", b"2a", b"3b"]);
        let mut desc = rows();
        in_page_order(&mut desc, true);
        assert_eq!(values(&desc), [b"3b".as_ref(), b"2a", b"2", b"1z"]);
        // Already ordered input is left as it is.
        in_page_order(&mut desc, true);
        assert_eq!(values(&desc), [b"3b".as_ref(), b"2a", b"2", b"1z"]);
    }
}
