//! [`Appends`] for the embedded store: insert-if-absent into Hot buckets, behind the fence.
//!
//! An append is one `BEGIN IMMEDIATE` transaction: it loads the table, routes the record to
//! its bucket (refusing buckets outside the writable guard), creates the bucket's metadata
//! as Hot if absent or refuses it unless it is Hot ([`ensure_hot`], the fence), then inserts.
//! The write lock is held from the check to the commit, so no archiver claim can slip in
//! between. A batch does all of that in one transaction: it commits whole or not at all.

use std::collections::HashSet;

use async_trait::async_trait;
use rusqlite::{params, Transaction};

use crate::model::{BucketId, Record, TableId};
use crate::store::{
    bucket_for_append, AppendOutcome, Appends, BatchOutcome, StoreError, StoreResult,
};

use super::catalog::require_table;
use super::decode::{state_name, time, BUCKET_PK};
use super::{Mode, SqliteStore, TxResult};

/// Creates the bucket's metadata as Hot if absent, then refuses unless it is Hot: the fence.
fn ensure_hot(tx: &Transaction<'_>, id: &BucketId, now: i64) -> TxResult<()> {
    let (start, end) = id.bucket_key.bounds();
    let inserted = tx
        .prepare_cached(
            "INSERT INTO pulpitum_v4_bucket_metadata \
             (table_id, partition_key, bucket_key, bucket_strategy, bucket_start, bucket_end, \
              state, generation, hot_deleted, created_at, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'hot', 0, 0, ?7, ?7) \
             ON CONFLICT (table_id, partition_key, bucket_key) DO NOTHING",
        )?
        .execute(params![
            id.table_id.as_str(),
            id.partition_key.as_bytes(),
            id.bucket_key.to_string(),
            id.bucket_key.strategy().as_str(),
            start.as_micros(),
            end.as_micros(),
            now,
        ])?;
    if inserted == 1 {
        return Ok(());
    }
    let state: String = tx
        .prepare_cached(&format!(
            "SELECT state FROM pulpitum_v4_bucket_metadata WHERE {BUCKET_PK}"
        ))?
        .query_row(
            params![
                id.table_id.as_str(),
                id.partition_key.as_bytes(),
                id.bucket_key.to_string()
            ],
            |r| r.get(0),
        )?;
    match state_name(&state)? {
        "hot" => Ok(()),
        state => Err(StoreError::Fenced {
            bucket: id.clone(),
            state,
        }
        .into()),
    }
}

/// Inserts one record into a bucket already checked Hot in this transaction.
fn insert_record(tx: &Transaction<'_>, id: &BucketId, record: &Record) -> TxResult<AppendOutcome> {
    let key = params![
        id.table_id.as_str(),
        id.partition_key.as_bytes(),
        id.bucket_key.to_string(),
        record.event_time.as_micros(),
        record.sort_key.as_bytes(),
        record.value.as_slice(),
    ];
    let inserted = tx
        .prepare_cached(
            "INSERT INTO pulpitum_v4_records \
             (table_id, partition_key, bucket_key, event_time, sort_key, value) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
             ON CONFLICT (table_id, partition_key, bucket_key, event_time, sort_key) DO NOTHING",
        )?
        .execute(key)?;
    if inserted == 1 {
        return Ok(AppendOutcome::Inserted);
    }
    let same: bool = tx
        .prepare_cached(&format!(
            "SELECT value = ?6 FROM pulpitum_v4_records \
             WHERE {BUCKET_PK} AND event_time = ?4 AND sort_key = ?5"
        ))?
        .query_row(key, |r| r.get(0))?;
    if same {
        Ok(AppendOutcome::AlreadyPresent)
    } else {
        Err(StoreError::DuplicateKey {
            bucket: id.clone(),
            event_time: record.event_time,
            sort_key: hex::encode(record.sort_key.as_bytes()),
        }
        .into())
    }
}

#[async_trait]
impl Appends for SqliteStore {
    async fn append(&self, table_id: &TableId, record: &Record) -> StoreResult<AppendOutcome> {
        let table_id = table_id.clone();
        let record = record.clone();
        self.run("append", Mode::Write, move |tx, now| {
            let def = require_table(tx, &table_id)?;
            let id = bucket_for_append(&def, &record, time(now, "store clock")?)?;
            ensure_hot(tx, &id, now)?;
            insert_record(tx, &id, &record)
        })
        .await
    }

    async fn append_batch(
        &self,
        table_id: &TableId,
        records: &[Record],
    ) -> StoreResult<BatchOutcome> {
        let table_id = table_id.clone();
        let records = records.to_vec();
        self.run("append_batch", Mode::Write, move |tx, now| {
            let def = require_table(tx, &table_id)?;
            let now_t = time(now, "store clock")?;
            // Each bucket is checked once per transaction; the write lock keeps it Hot until
            // commit, so later records of the same bucket need no second check.
            let mut checked: HashSet<BucketId> = HashSet::new();
            let mut out = BatchOutcome::default();
            for record in &records {
                let id = bucket_for_append(&def, record, now_t)?;
                if !checked.contains(&id) {
                    ensure_hot(tx, &id, now)?;
                    checked.insert(id.clone());
                }
                match insert_record(tx, &id, record)? {
                    AppendOutcome::Inserted => out.inserted += 1,
                    AppendOutcome::AlreadyPresent => out.already_present += 1,
                }
            }
            Ok(out)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{rec, store_with, tid};
    use super::*;
    use crate::model::{BucketStrategy, ScanBounds};
    use crate::store::{BucketState, Catalog, HotPage, PageRequest, RoutedReads, TableDefinition};

    #[tokio::test]
    async fn append_is_insert_if_absent_and_typed() {
        let def = TableDefinition::new(tid("t"), BucketStrategy::CalendarYearUtc, "raw");
        let s = store_with(&def).await;
        let r = rec(b"p", 1_700_000_000_000_000, b"a", b"v1");
        assert!(matches!(
            s.append(&tid("unknown"), &r).await,
            Err(StoreError::UnknownTable(_))
        ));
        assert_eq!(
            s.append(&tid("t"), &r).await.unwrap(),
            AppendOutcome::Inserted
        );
        assert_eq!(
            s.append(&tid("t"), &r).await.unwrap(),
            AppendOutcome::AlreadyPresent
        );
        let changed = Record {
            value: b"v2".to_vec(),
            ..r.clone()
        };
        let err = s.append(&tid("t"), &changed).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::DuplicateKey { sort_key, .. } if sort_key == "61"),
            "{err}"
        );
        let id = BucketId::of_record(&tid("t"), def.strategy, &r);
        let meta = s.bucket(&id).await.unwrap().unwrap();
        assert_eq!(meta.state, BucketState::Hot);
        assert_eq!(meta.generation, 0);
        assert_eq!(meta.owner_token, None);
        let page = s
            .read_page(
                &id,
                &PageRequest {
                    bounds: ScanBounds::all(),
                    descending: false,
                    limit: 10,
                    include_value: true,
                },
            )
            .await
            .unwrap();
        assert_eq!(page, HotPage::hot(BucketState::Hot, &[r], true));
    }

    #[tokio::test]
    async fn writable_bucket_guard_rejects_old_buckets_and_writes_nothing() {
        let mut def = TableDefinition::new(tid("g"), BucketStrategy::CalendarDayUtc, "raw");
        def.writable_buckets = Some(2);
        let s = store_with(&def).await;
        let now = s.now().await.unwrap().as_micros();
        let day = 86_400_000_000;
        let old = rec(b"p", now - 3 * day, b"", b"x");
        let err = s.append(&tid("g"), &old).await.unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::NotWritable {
                    writable_buckets: 2,
                    ..
                }
            ),
            "{err}"
        );
        let id = BucketId::of_record(&tid("g"), def.strategy, &old);
        assert_eq!(s.bucket(&id).await.unwrap(), None);
        // Yesterday is the second-newest bucket: accepted.
        let recent = rec(b"p", now - day, b"", b"x");
        assert_eq!(
            s.append(&tid("g"), &recent).await.unwrap(),
            AppendOutcome::Inserted
        );
        // A batch with one guarded record commits nothing.
        let err = s
            .append_batch(&tid("g"), &[rec(b"q", now, b"", b"x"), old.clone()])
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::NotWritable { .. }));
        let q = BucketId::of_record(&tid("g"), def.strategy, &rec(b"q", now, b"", b""));
        assert_eq!(s.bucket(&q).await.unwrap(), None);
    }
}
