//! [`RoutedReads`] for the embedded store: bucket listings, one bucket's metadata, pages.
//!
//! Reads run in deferred transactions on the read-only connections, so each sees one WAL
//! snapshot: [`RoutedReads::read_page`] reads the route (the bucket's state) and the rows in
//! the same snapshot, the embedded form of "route and rows from one statement". The head
//! read is the trait's default over `read_page`. Statements are built with a fixed shape per
//! set of bounds so SQLite's prepared-statement cache keeps them.

use std::ops::Bound;

use async_trait::async_trait;
use rusqlite::types::Value;
use rusqlite::{params_from_iter, OptionalExtension};

use crate::model::{BucketId, EventTime, PartitionKey, SortKey, TableId};
use crate::store::{
    AcrossListing, BucketFilter, BucketMeta, BucketState, HotPage, PageRequest, RoutedReads,
    StoreResult,
};

use super::decode::{bucket_args, load_meta, meta_from_row, record_from, to_i64, META_COLUMNS};
use super::{Mode, SqliteStore};

/// Appends a bound on `col` to a WHERE clause.
fn push_bound(sql: &mut String, args: &mut Vec<Value>, col: &str, lower: bool, b: &Bound<Value>) {
    let (op, v) = match (b, lower) {
        (Bound::Unbounded, _) => return,
        (Bound::Included(v), true) => (">=", v),
        (Bound::Excluded(v), true) => (">", v),
        (Bound::Included(v), false) => ("<=", v),
        (Bound::Excluded(v), false) => ("<", v),
    };
    sql.push_str(&format!(" AND {col} {op} ?"));
    args.push(v.clone());
}

fn time_bound(b: &Bound<EventTime>) -> Bound<Value> {
    b.as_ref().map(|t| Value::Integer(t.as_micros()))
}

fn sort_bound(b: &Bound<SortKey>) -> Bound<Value> {
    b.as_ref().map(|k| Value::Blob(k.as_bytes().to_vec()))
}

#[async_trait]
impl RoutedReads for SqliteStore {
    async fn list_buckets(
        &self,
        table_id: &TableId,
        filter: &BucketFilter,
    ) -> StoreResult<Vec<BucketMeta>> {
        let table_id = table_id.clone();
        let filter = filter.clone();
        // An unregistered table simply has no buckets (as in the PostgreSQL store).
        self.run("list_buckets", Mode::Read, move |tx, _| {
            let mut sql = format!(
                "SELECT {META_COLUMNS} FROM pulpitum_v4_bucket_metadata WHERE table_id = ?"
            );
            let mut base = vec![Value::Text(table_id.as_str().to_string())];
            if let Some(from) = filter.from {
                sql.push_str(" AND bucket_end > ?");
                base.push(Value::Integer(from.as_micros()));
            }
            if let Some(to) = filter.to {
                sql.push_str(" AND bucket_start <= ?");
                base.push(Value::Integer(to.as_micros()));
            }
            // One query per requested partition, in key order, keeps the statement's shape
            // fixed whatever the number of partitions (SQLite caps bound parameters).
            let partitions: Vec<Option<&PartitionKey>> = match &filter.partitions {
                None => vec![None],
                Some(ps) => {
                    let mut ps: Vec<&PartitionKey> = ps.iter().collect();
                    ps.sort();
                    ps.dedup();
                    ps.into_iter().map(Some).collect()
                }
            };
            let mut out = Vec::new();
            for p in partitions {
                let mut sql = sql.clone();
                let mut args = base.clone();
                if let Some(p) = p {
                    sql.push_str(" AND partition_key = ?");
                    args.push(Value::Blob(p.as_bytes().to_vec()));
                }
                sql.push_str(if filter.descending {
                    " ORDER BY partition_key, bucket_start DESC"
                } else {
                    " ORDER BY partition_key, bucket_start"
                });
                if let Some(limit) = filter.limit {
                    // The limit is over the whole listing, partitions in key order.
                    let left = limit.saturating_sub(out.len());
                    if left == 0 {
                        break;
                    }
                    sql.push_str(" LIMIT ?");
                    args.push(Value::Integer(i64::try_from(left).unwrap_or(i64::MAX)));
                }
                let mut stmt = tx.prepare_cached(&sql)?;
                let rows = stmt.query_map(params_from_iter(args.iter()), meta_from_row)?;
                for row in rows {
                    out.push(row?.to_meta()?);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn list_across(
        &self,
        table_id: &TableId,
        from: EventTime,
        to: EventTime,
    ) -> StoreResult<Option<AcrossListing>> {
        let table_id = table_id.clone();
        // One deferred transaction: every statement reads the same WAL snapshot (see the
        // PostgreSQL store for what the statements are).
        self.run("list_across", Mode::Read, move |tx, _| {
            let until = to;
            let (table, from, to) = (table_id.as_str(), from.as_micros(), to.as_micros());
            let mut whole = Vec::new();
            let mut partial = Vec::new();
            {
                let mut stmt = tx.prepare_cached(
                    "SELECT s.object_key, s.buckets, \
                       (SELECT count(*) FROM pulpitum_v4_bucket_metadata m \
                        WHERE m.object_key = s.object_key) \
                     FROM pulpitum_v4_segment_routes s \
                     WHERE s.table_id = ?1 AND s.window_end > ?2 AND s.window_start <= ?3",
                )?;
                let rows = stmt.query_map(rusqlite::params![table, from, to], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                })?;
                for row in rows {
                    let (key, held, routed) = row?;
                    match u64::try_from(held) {
                        Ok(n) if held == routed => whole.push((key, n)),
                        _ => partial.push(key),
                    }
                }
            }
            // The end of the grid bucket holding `to` bounds the index range from above (no
            // bucket starting at or before `to` ends later), as in the PostgreSQL store.
            let strategy: Option<String> = tx
                .prepare_cached(
                    "SELECT bucket_strategy FROM pulpitum_v4_tables WHERE table_id = ?1",
                )?
                .query_row([table], |r| r.get(0))
                .optional()?;
            let ceiling = strategy
                .and_then(|s| s.parse::<crate::model::BucketStrategy>().ok())
                .map_or(EventTime::end_of_supported(), |s| s.bucket_of(until).end())
                .as_micros();
            let mut out = Vec::new();
            {
                // The predicate of migration 16's partial index, verbatim.
                let mut stmt = tx.prepare_cached(&format!(
                    "SELECT {META_COLUMNS} FROM pulpitum_v4_bucket_metadata \
                     WHERE table_id = ?1 AND bucket_end > ?2 AND bucket_end <= ?4 \
                       AND bucket_start <= ?3 \
                       AND (object_key IS NULL OR NOT (object_key GLOB \
                         '*/segments/*/s?????-g*/manifest.json'))"
                ))?;
                let rows =
                    stmt.query_map(rusqlite::params![table, from, to, ceiling], meta_from_row)?;
                for row in rows {
                    out.push(row?.to_meta()?);
                }
            }
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT {META_COLUMNS} FROM pulpitum_v4_bucket_metadata \
                 WHERE object_key = ?4 AND table_id = ?1 AND bucket_end > ?2 \
                   AND bucket_start <= ?3"
            ))?;
            for key in &partial {
                for row in stmt.query_map(rusqlite::params![table, from, to, key], meta_from_row)? {
                    out.push(row?.to_meta()?);
                }
            }
            Ok(Some(AcrossListing {
                segments: whole,
                buckets: out,
            }))
        })
        .await
    }

    async fn bucket(&self, bucket: &BucketId) -> StoreResult<Option<BucketMeta>> {
        let id = bucket.clone();
        self.run("bucket", Mode::Read, move |tx, _| {
            load_meta(tx, &id)?.map(|m| m.to_meta()).transpose()
        })
        .await
    }

    async fn read_page(&self, bucket: &BucketId, req: &PageRequest) -> StoreResult<HotPage> {
        let id = bucket.clone();
        let req = req.clone();
        // A deferred transaction: both statements read the same WAL snapshot, so the route
        // and the rows belong to one moment.
        self.run("read_page", Mode::Read, move |tx, _| {
            let Some(meta) = load_meta(tx, &id)? else {
                return Ok(HotPage::Missing);
            };
            let state = match meta.state()? {
                BucketState::Archived { object_key, .. } => {
                    return Ok(HotPage::Archived { object_key })
                }
                s => s,
            };
            let b = &req.bounds;
            let value_col = if req.include_value { ", value" } else { "" };
            let mut sql = format!(
                "SELECT event_time, sort_key{value_col} FROM pulpitum_v4_records \
                 WHERE table_id = ? AND partition_key = ? AND bucket_key = ?"
            );
            let mut args = bucket_args(&id);
            push_bound(
                &mut sql,
                &mut args,
                "event_time",
                true,
                &time_bound(&b.time_lower),
            );
            push_bound(
                &mut sql,
                &mut args,
                "event_time",
                false,
                &time_bound(&b.time_upper),
            );
            push_bound(
                &mut sql,
                &mut args,
                "sort_key",
                true,
                &sort_bound(&b.sort_lower),
            );
            push_bound(
                &mut sql,
                &mut args,
                "sort_key",
                false,
                &sort_bound(&b.sort_upper),
            );
            for (cursor, op) in [(&b.after, ">"), (&b.before, "<")] {
                if let Some(c) = cursor {
                    sql.push_str(&format!(" AND (event_time, sort_key) {op} (?, ?)"));
                    args.push(Value::Integer(c.event_time.as_micros()));
                    args.push(Value::Blob(c.sort_key.as_bytes().to_vec()));
                }
            }
            let dir = if req.descending { "DESC" } else { "ASC" };
            sql.push_str(&format!(
                " ORDER BY event_time {dir}, sort_key {dir} LIMIT ?"
            ));
            args.push(Value::Integer(to_i64(req.limit)));
            let mut stmt = tx.prepare_cached(&sql)?;
            let mut rows = stmt.query(params_from_iter(args.iter()))?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                let value = if req.include_value {
                    r.get(2)?
                } else {
                    Vec::new()
                };
                out.push(record_from(&id.partition_key, r.get(0)?, r.get(1)?, value)?);
            }
            Ok(HotPage::hot(state, &out, req.include_value))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{rec, store_with, tid};
    use super::*;
    use crate::model::{BucketStrategy, ClusteringKey, Record, ScanBounds};
    use crate::store::{Appends, TableDefinition};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn random_bounds(rng: &mut StdRng, times: &[i64], keys: &[Vec<u8>]) -> ScanBounds {
        let t = |rng: &mut StdRng| {
            EventTime::from_micros(times[rng.random_range(0..times.len())]).unwrap()
        };
        let k =
            |rng: &mut StdRng| SortKey::new(keys[rng.random_range(0..keys.len())].clone()).unwrap();
        let tb = |rng: &mut StdRng| match rng.random_range(0..3) {
            0 => Bound::Unbounded,
            1 => Bound::Included(t(rng)),
            _ => Bound::Excluded(t(rng)),
        };
        let kb = |rng: &mut StdRng| match rng.random_range(0..4) {
            0 | 1 => Bound::Unbounded,
            2 => Bound::Included(k(rng)),
            _ => Bound::Excluded(k(rng)),
        };
        let ck = |rng: &mut StdRng| {
            rng.random_bool(0.4).then(|| ClusteringKey {
                event_time: t(rng),
                sort_key: k(rng),
            })
        };
        ScanBounds {
            time_lower: tb(rng),
            time_upper: tb(rng),
            sort_lower: kb(rng),
            sort_upper: kb(rng),
            after: ck(rng),
            before: ck(rng),
        }
    }

    /// `read_page` must agree exactly with the reference filter `ScanBounds::matches`, in
    /// both orders, with limits and without values.
    #[tokio::test]
    async fn read_page_applies_bounds_like_the_reference_filter() {
        let def = TableDefinition::new(tid("b"), BucketStrategy::CalendarYearUtc, "raw");
        let s = store_with(&def).await;
        let base = 1_700_000_000_000_000;
        let times: Vec<i64> = (0..8).map(|i| base + i * 1_000).collect();
        // Keys that differ in length and in a byte >= 0x80, where bytewise order matters.
        let keys: Vec<Vec<u8>> = vec![
            vec![],
            vec![0],
            vec![0, 0],
            vec![1],
            vec![0x7f],
            vec![0x80],
            vec![0xff, 1],
        ];
        let mut all = Vec::new();
        for &t in &times {
            for k in &keys {
                all.push(rec(b"p", t, k, &[k.len() as u8, (t % 251) as u8]));
            }
        }
        let out = s.append_batch(&tid("b"), &all).await.unwrap();
        assert_eq!(out.inserted, all.len() as u64);
        all.sort_by_key(Record::clustering_key);
        let id = BucketId::of_record(&tid("b"), def.strategy, &all[0]);
        let mut rng = StdRng::seed_from_u64(7);
        let mut nonempty = 0;
        for _ in 0..300 {
            let bounds = random_bounds(&mut rng, &times, &keys);
            let descending = rng.random_bool(0.5);
            let include_value = rng.random_bool(0.5);
            let limit = rng.random_range(1..70);
            let mut want: Vec<Record> = all.iter().filter(|r| bounds.matches(r)).cloned().collect();
            if descending {
                want.reverse();
            }
            want.truncate(limit);
            if !include_value {
                for r in &mut want {
                    r.value.clear();
                }
            }
            nonempty += usize::from(!want.is_empty());
            let req = PageRequest {
                bounds: bounds.clone(),
                descending,
                limit,
                include_value,
            };
            let HotPage::Hot { state, rows } = s.read_page(&id, &req).await.unwrap() else {
                panic!("bucket should be hot");
            };
            assert_eq!(state, BucketState::Hot);
            assert_eq!(
                rows,
                crate::model::records_to_batch(&want, include_value),
                "bounds {bounds:?} desc {descending} limit {limit}"
            );
        }
        assert!(
            nonempty > 100,
            "the random bounds should mostly select rows ({nonempty})"
        );
    }
}
