//! Shared helpers of the DELETE/UPDATE tests: a table over PostgreSQL or the embedded
//! store and the real S3, the archiver run on demand, and the whole table read back as a
//! model to compare.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::archiver_support::*;
use datafusion::arrow::array::{Array, Int64Array, StringArray, UInt64Array};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::prelude::SessionContext;
use pulpitum::archive::{ArchiveStore, PayloadFormat};
use pulpitum::archiver::{ArchiverConfig, Runner};
use pulpitum::model::{EventTime, TableId};
use pulpitum::session::{session, SessionOptions};
use pulpitum::store::{BucketFilter, BucketState, HotStore};
use tokio_util::sync::CancellationToken;

pub const DAY_US: i64 = 86_400_000_000;

/// Message `id` of channel `ch` at `t` (µs), with the body `m<id>`.
pub fn record(ch: i64, id: i64, t: i64) -> pulpitum::model::Record {
    message(ch, id, t, &format!("m{id}"))
}

/// Message `id` of channel `ch` at `t` (µs) with the body `content`.
pub fn message(ch: i64, id: i64, t: i64, content: &str) -> pulpitum::model::Record {
    use pulpitum::model::{encode_i64, PartitionKey, Record, SortKey};
    Record {
        partition_key: PartitionKey::from_i64(ch),
        event_time: EventTime::from_micros(t).unwrap(),
        sort_key: SortKey::new(encode_i64(id).to_vec()).unwrap(),
        value: content.as_bytes().to_vec(),
    }
}
pub const START: &str = "2021-03-01T00:00:00Z";

/// `(channel, id) -> (event time in µs, content)`: what the table must answer.
pub type Model = BTreeMap<(i64, i64), (i64, String)>;

pub struct Env {
    /// The hot store's URL.
    pub db: String,
    /// The archive's URL.
    pub archive_url: String,
    pub store: Arc<dyn HotStore>,
    pub archive: Arc<ArchiveStore>,
    pub ctx: SessionContext,
    pub table: TableId,
    pub dir: Option<tempfile::TempDir>,
}

impl Env {
    pub async fn new(label: &str, embedded: bool) -> Self {
        let archive_url = fresh_archive_url(label);
        let (db, dir) = if embedded {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("hot.db");
            (format!("sqlite://{}", path.display()), Some(dir))
        } else {
            (fresh_database(label).await, None)
        };
        let (store, archive) = open(&db, &archive_url).await;
        let opts = SessionOptions {
            page_rows: 7,
            ..SessionOptions::default()
        };
        let ctx = session(store.clone(), archive.clone(), opts).await.unwrap();
        let env = Self {
            db,
            archive_url,
            store,
            archive,
            ctx,
            table: TableId::new("chat").unwrap(),
            dir,
        };
        env.sql("CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')").await.unwrap();
        env
    }

    pub async fn sql(&self, sql: &str) -> Result<Vec<RecordBatch>, String> {
        run(&self.ctx, sql).await
    }

    /// Runs a DELETE or UPDATE and returns its count.
    pub async fn change(&self, sql: &str) -> Result<u64, String> {
        count(&self.sql(sql).await?)
    }

    /// Archives every bucket ending before `before` in `format`; with `segments`, compacts
    /// the archived windows into segments afterwards.
    pub async fn archive_before(&self, before: &str, format: PayloadFormat, segments: bool) {
        let mut c = ArchiverConfig::with_defaults();
        c.eligible_before = Some(EventTime::parse_rfc3339(before).unwrap());
        c.cleanup_delay = Duration::ZERO;
        c.format = format;
        c.compaction = segments;
        c.compact_after = Duration::ZERO;
        c.concurrency = 2;
        let runner = Runner::new(self.store.clone(), self.archive.clone(), c).unwrap();
        runner
            .drain(&CancellationToken::new(), &|_, _| {})
            .await
            .unwrap();
        if segments {
            let r = runner.compact_pass().await.unwrap();
            assert_eq!(r.failed, 0, "{r:?}");
        }
    }

    pub async fn states(&self) -> Vec<BucketState> {
        self.store
            .list_buckets(&self.table, &BucketFilter::default())
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.state)
            .collect()
    }

    pub async fn dump(&self) -> Model {
        dump(&self.ctx).await
    }
}

pub async fn run(ctx: &SessionContext, sql: &str) -> Result<Vec<RecordBatch>, String> {
    let df = ctx.sql(sql).await.map_err(|e| e.to_string())?;
    df.collect().await.map_err(|e| e.to_string())
}

pub fn count(b: &[RecordBatch]) -> Result<u64, String> {
    let c = b[0]
        .column(0)
        .as_any()
        .downcast_ref::<UInt64Array>()
        .ok_or("count is not UInt64")?;
    Ok(c.value(0))
}

/// The whole table through SQL.
pub async fn dump(ctx: &SessionContext) -> Model {
    let b = run(
        ctx,
        "SELECT channel_id, id, CAST(timestamp AS BIGINT), content FROM chat ORDER BY channel_id, id",
    )
    .await
    .unwrap();
    model_of(&b)
}

/// Rows `(channel_id, id, timestamp as BIGINT, content)` as a model; panics on a row read
/// twice.
pub fn model_of(b: &[RecordBatch]) -> Model {
    let mut out = Model::new();
    for batch in b {
        let ch = batch
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        let id = batch
            .column(1)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        let ts = batch
            .column(2)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        let content = batch
            .column(3)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        for i in 0..batch.num_rows() {
            let prev = out.insert(
                (ch.value(i), id.value(i)),
                (ts.value(i), content.value(i).to_string()),
            );
            assert!(
                prev.is_none(),
                "row ({}, {}) read twice",
                ch.value(i),
                id.value(i)
            );
        }
    }
    out
}

/// Panics naming the first rows where `got` and `want` differ.
pub fn assert_same(got: &Model, want: &Model, what: &str) {
    if got == want {
        return;
    }
    let missing: Vec<_> = want
        .iter()
        .filter(|(k, v)| got.get(k) != Some(v))
        .take(5)
        .collect();
    let extra: Vec<_> = got
        .iter()
        .filter(|(k, v)| want.get(k) != Some(v))
        .take(5)
        .collect();
    panic!(
        "{what}: {} rows read, {} expected; expected but not read: {missing:?}; read but not expected: {extra:?}",
        got.len(),
        want.len()
    );
}
