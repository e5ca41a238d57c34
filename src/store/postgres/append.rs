//! [`Appends`] on PostgreSQL: a record or a batch appended in one self-committing
//! statement that checks the fence, creates missing buckets and inserts the rows.
//!
//! A batch is first validated and laid out as column arrays (`prepare_batch`: the writable
//! window, duplicates inside the batch, one entry per bucket), then sent as [`APPEND_SQL`];
//! a single record takes [`APPEND_ONE_SQL`], the same statement without arrays. Either
//! writes nothing when a bucket is fenced or a key holds another value, and reports which.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use deadpool_postgres::Object;

use super::{describe, PgStore, TxError, TxResult};
use crate::model::{BucketId, BucketKey, EventTime, PartitionKey, Record, TableId};
use crate::store::{
    bucket_for_append, AppendOutcome, Appends, BatchOutcome, Catalog, StoreError, StoreResult,
    TableDefinition,
};

impl PgStore {
    /// The shared append path: one record is a batch of one. The whole append is ONE
    /// statement, run as its own (serializable, by the session default) transaction: the
    /// fence check, the bucket creation and the insert cannot be separated, and a single
    /// round trip keeps it close to a plain INSERT.
    async fn append_records(
        &self,
        op: &'static str,
        table_id: &TableId,
        records: &[Record],
    ) -> StoreResult<BatchOutcome> {
        if records.is_empty() {
            return Ok(BatchOutcome::default());
        }
        let def = self.definition(table_id).await?;
        // The guard is an ingestion policy on the store's clock, not a safety check, so a
        // clock read just before the statement is as good as one inside it.
        let now = if def.writable_buckets.is_some() {
            self.now().await?
        } else {
            EventTime::min_supported()
        };
        let batch = prepare_batch(&def, records, now)?;
        let gate = crate::store::gate::current();
        let mut outcome = self
            .run(op, || async {
                let client = self.pooled().await?;
                append_statement(&client, &def, &batch, gate.as_deref()).await
            })
            .await?;
        outcome.already_present += batch.duplicates_in_batch;
        Ok(outcome)
    }
}

/// A stored state as the static name a [`StoreError::Fenced`] carries.
fn state_name(s: &str) -> StoreResult<&'static str> {
    match s {
        "hot" => Ok("hot"),
        "archiving" => Ok("archiving"),
        "archived" => Ok("archived"),
        other => Err(StoreError::Corrupt(format!(
            "unknown bucket state {other:?}"
        ))),
    }
}

/// A batch validated, deduplicated and laid out as the column arrays the append statement
/// takes, borrowing the records' bytes.
struct PreparedBatch<'a> {
    buckets: Vec<(&'a PartitionKey, BucketKey)>,
    b_partition: Vec<&'a [u8]>,
    b_key: Vec<String>,
    b_start: Vec<DateTime<Utc>>,
    b_end: Vec<DateTime<Utc>>,
    r_partition: Vec<&'a [u8]>,
    r_bucket: Vec<String>,
    r_time: Vec<DateTime<Utc>>,
    r_sort: Vec<&'a [u8]>,
    r_value: Vec<&'a [u8]>,
    kept: Vec<&'a Record>,
    /// Identical copies of a record inside the batch itself (counted as already present).
    duplicates_in_batch: u64,
}

/// `(partition_key, event_time, sort_key)`: a record's identity within its table.
type PhysicalKey<'a> = (&'a [u8], EventTime, &'a [u8]);

fn prepare_batch<'a>(
    def: &TableDefinition,
    records: &'a [Record],
    now: EventTime,
) -> StoreResult<PreparedBatch<'a>> {
    let n = records.len();
    // Batches usually arrive in clustering order; then no key can repeat and the hash set
    // below is not needed (it costs more than the rest of the preparation).
    let ordered = records.windows(2).all(|w| {
        (
            w[0].partition_key.as_bytes(),
            w[0].event_time,
            w[0].sort_key.as_bytes(),
        ) < (
            w[1].partition_key.as_bytes(),
            w[1].event_time,
            w[1].sort_key.as_bytes(),
        )
    });
    let mut seen: HashMap<PhysicalKey<'a>, &'a [u8]> = HashMap::new();
    let mut b = PreparedBatch {
        buckets: Vec::new(),
        b_partition: Vec::new(),
        b_key: Vec::new(),
        b_start: Vec::new(),
        b_end: Vec::new(),
        r_partition: Vec::with_capacity(n),
        r_bucket: Vec::with_capacity(n),
        r_time: Vec::with_capacity(n),
        r_sort: Vec::with_capacity(n),
        r_value: Vec::with_capacity(n),
        kept: Vec::with_capacity(n),
        duplicates_in_batch: 0,
    };
    // The bucket of the previous record, with its bounds: consecutive records mostly share it.
    let mut last: Option<(&'a [u8], BucketKey, EventTime, EventTime, String)> = None;
    for r in records {
        if def.writable_buckets.is_some() {
            bucket_for_append(def, r, now)?;
        }
        if !ordered {
            let key = (
                r.partition_key.as_bytes(),
                r.event_time,
                r.sort_key.as_bytes(),
            );
            match seen.get(&key) {
                Some(v) if *v == r.value.as_slice() => {
                    b.duplicates_in_batch += 1;
                    continue;
                }
                // Two values for one key in the same batch: refused before any I/O.
                Some(_) => {
                    return Err(StoreError::DuplicateKey {
                        bucket: BucketId::of_record(&def.table_id, def.strategy, r),
                        event_time: r.event_time,
                        sort_key: hex::encode(r.sort_key.as_bytes()),
                    })
                }
                None => {
                    seen.insert(key, &r.value);
                }
            }
        }
        let pk = r.partition_key.as_bytes();
        let reuse = matches!(&last, Some((p, _, s, e, _)) if *p == pk && *s <= r.event_time && r.event_time < *e);
        if !reuse {
            let bucket_key = def.strategy.bucket_of(r.event_time);
            let (start, end) = bucket_key.bounds();
            let text = bucket_key.to_string();
            if !b
                .buckets
                .iter()
                .any(|(p, k)| p.as_bytes() == pk && *k == bucket_key)
            {
                b.buckets.push((&r.partition_key, bucket_key));
                b.b_partition.push(pk);
                b.b_key.push(text.clone());
                b.b_start.push(start.to_datetime());
                b.b_end.push(end.to_datetime());
            }
            last = Some((pk, bucket_key, start, end, text));
        }
        let text = last.as_ref().map(|l| l.4.clone()).unwrap_or_default();
        b.r_partition.push(pk);
        b.r_bucket.push(text);
        b.r_time.push(r.event_time.to_datetime());
        b.r_sort.push(r.sort_key.as_bytes());
        b.r_value.push(&r.value);
        b.kept.push(r);
    }
    Ok(b)
}

/// The whole append as one statement. `fenced` reads the existing metadata of the batch's
/// buckets (a bucket created by this statement is Hot by construction); `old` compares
/// the records with rows already stored. New bucket metadata and the records are written
/// only when no bucket is fenced and no key holds another value, so a refused batch writes
/// nothing at all. Records already present (identical) are skipped by the probe, so the
/// insert needs no ON CONFLICT (a plain insert is cheaper than a speculative one): a key
/// inserted concurrently after the statement's snapshot fails with 23505 (or 40001), and
/// the statement, which then committed nothing, runs again and finds it. The lookups are LATERAL ... LIMIT 1 so that even a plan cached while
/// the tables were empty probes the primary key per row instead of hashing a whole table.
const APPEND_SQL: &str = "WITH b AS ( \
       SELECT * FROM unnest($2::BYTEA[], $3::TEXT[], $4::TIMESTAMPTZ[], $5::TIMESTAMPTZ[]) \
         AS b(partition_key, bucket_key, bucket_start, bucket_end) \
     ), fenced AS ( \
       SELECT b.partition_key, b.bucket_key, x.state FROM b CROSS JOIN LATERAL ( \
         SELECT m.state FROM pulpitum_v4_bucket_metadata m WHERE m.table_id = $1 \
           AND m.partition_key = b.partition_key AND m.bucket_key = b.bucket_key LIMIT 1) x \
       WHERE x.state <> 'hot' ORDER BY b.partition_key, b.bucket_key LIMIT 1 \
     ), u AS ( \
       SELECT * FROM unnest($7::BYTEA[], $8::TEXT[], $9::TIMESTAMPTZ[], $10::BYTEA[], $11::BYTEA[]) \
         WITH ORDINALITY AS u(partition_key, bucket_key, event_time, sort_key, value, i) \
     ), old AS ( \
       SELECT u.i, x.value = u.value AS same FROM u CROSS JOIN LATERAL ( \
         SELECT r.value FROM pulpitum_v4_records r WHERE r.table_id = $1 \
           AND r.partition_key = u.partition_key AND r.bucket_key = u.bucket_key \
           AND r.event_time = u.event_time AND r.sort_key = u.sort_key LIMIT 1) x \
     ), ok AS ( \
       SELECT NOT EXISTS (SELECT 1 FROM fenced) AND NOT EXISTS (SELECT 1 FROM old WHERE NOT same) AS go \
     ), ins_meta AS ( \
       INSERT INTO pulpitum_v4_bucket_metadata \
         (table_id, partition_key, bucket_key, bucket_strategy, bucket_start, bucket_end, state) \
       SELECT $1, b.partition_key, b.bucket_key, $6, b.bucket_start, b.bucket_end, 'hot' FROM b \
       WHERE (SELECT go FROM ok) \
       ON CONFLICT (table_id, partition_key, bucket_key) DO NOTHING \
       RETURNING 1 \
     ), ins AS ( \
       INSERT INTO pulpitum_v4_records (table_id, partition_key, bucket_key, event_time, sort_key, value) \
       SELECT $1, u.partition_key, u.bucket_key, u.event_time, u.sort_key, u.value FROM u \
       WHERE (SELECT go FROM ok) AND NOT EXISTS (SELECT 1 FROM old WHERE old.i = u.i) \
       RETURNING 1 \
     ) \
     SELECT (SELECT count(*) FROM ins)::INT8, (SELECT count(*) FROM old WHERE same)::INT8, \
       (SELECT min(i) FROM old WHERE NOT same)::INT8, f.partition_key, f.bucket_key, f.state \
     FROM (SELECT 1) AS one LEFT JOIN fenced f ON true";

/// [`APPEND_SQL`] for one record, without arrays: the common single-row path.
const APPEND_ONE_SQL: &str = "WITH fenced AS ( \
       SELECT m.state FROM pulpitum_v4_bucket_metadata m \
       WHERE m.table_id = $1 AND m.partition_key = $2 AND m.bucket_key = $3 AND m.state <> 'hot' \
     ), old AS ( \
       SELECT r.value = $9 AS same FROM pulpitum_v4_records r \
       WHERE r.table_id = $1 AND r.partition_key = $2 AND r.bucket_key = $3 \
         AND r.event_time = $7 AND r.sort_key = $8 \
     ), ok AS ( \
       SELECT NOT EXISTS (SELECT 1 FROM fenced) AND NOT EXISTS (SELECT 1 FROM old) AS go \
     ), ins_meta AS ( \
       INSERT INTO pulpitum_v4_bucket_metadata \
         (table_id, partition_key, bucket_key, bucket_strategy, bucket_start, bucket_end, state) \
       SELECT $1, $2, $3, $4, $5, $6, 'hot' WHERE (SELECT go FROM ok) \
       ON CONFLICT (table_id, partition_key, bucket_key) DO NOTHING \
       RETURNING 1 \
     ), ins AS ( \
       INSERT INTO pulpitum_v4_records (table_id, partition_key, bucket_key, event_time, sort_key, value) \
       SELECT $1, $2, $3, $7, $8, $9 WHERE (SELECT go FROM ok) \
       RETURNING 1 \
     ) \
     SELECT (SELECT count(*) FROM ins)::INT8, (SELECT count(*) FROM old WHERE same)::INT8, \
       (SELECT count(*) FROM old WHERE NOT same)::INT8, (SELECT state FROM fenced LIMIT 1)";

/// Classifies an error of a self-committing append statement: a unique violation means a
/// concurrent append of the same key won (nothing of this statement committed, so running
/// it again is safe and then sees that row); anything else may hide a commit.
fn append_error(e: tokio_postgres::Error) -> TxError {
    if e.code().is_some_and(|c| c.code() == "23505") {
        TxError::Conflict(describe(&e))
    } else {
        TxError::Commit(e)
    }
}

async fn append_statement(
    client: &Object,
    def: &TableDefinition,
    b: &PreparedBatch<'_>,
    gate: Option<&crate::store::gate::CommitGate>,
) -> TxResult<BatchOutcome> {
    let stmt = client.prepare_cached(APPEND_SQL).await?;
    let strategy = def.strategy.as_str();
    // The statement commits by itself, so it is the commit a wire statement's gate guards:
    // an abandoned statement sends nothing (see `store::gate`).
    if !crate::store::gate::may_commit(gate) {
        return Err(TxError::Store(super::changes::abandoned("append")));
    }
    // The statement commits by itself: an error while it runs may hide a commit.
    let row = client
        .query_one(
            &stmt,
            &[
                &def.table_id.as_str(),
                &b.b_partition,
                &b.b_key,
                &b.b_start,
                &b.b_end,
                &strategy,
                &b.r_partition,
                &b.r_bucket,
                &b.r_time,
                &b.r_sort,
                &b.r_value,
            ],
        )
        .await
        .map_err(append_error)?;
    let inserted: i64 = row.try_get(0)?;
    let present: i64 = row.try_get(1)?;
    let clash: Option<i64> = row.try_get(2)?;
    if let Some(state) = row.try_get::<_, Option<String>>(5)? {
        let pk: Vec<u8> = row.try_get(3)?;
        let key: String = row.try_get(4)?;
        let bucket = b
            .buckets
            .iter()
            .find(|(p, k)| p.as_bytes() == pk.as_slice() && k.to_string() == key)
            .map(|(p, k)| BucketId {
                table_id: def.table_id.clone(),
                partition_key: (*p).clone(),
                bucket_key: *k,
            })
            .ok_or_else(|| {
                StoreError::Corrupt(format!("fenced bucket {key} is not in the batch"))
            })?;
        return Err(TxError::Store(StoreError::Fenced {
            bucket,
            state: state_name(&state)?,
        }));
    }
    if let Some(i) = clash {
        let i = usize::try_from(i - 1).map_err(|_| StoreError::Corrupt("bad ordinality".into()))?;
        let r = b.kept[i];
        return Err(TxError::Store(StoreError::DuplicateKey {
            bucket: BucketId::of_record(&def.table_id, def.strategy, r),
            event_time: r.event_time,
            sort_key: hex::encode(r.sort_key.as_bytes()),
        }));
    }
    let total = b.r_time.len() as u64;
    let inserted = u64::try_from(inserted).unwrap_or(0);
    let present = u64::try_from(present).unwrap_or(0);
    if inserted + present != total {
        // A row skipped by ON CONFLICT that the statement's snapshot did not show: a
        // concurrent commit. Appends are idempotent, so running again is safe.
        return Err(TxError::Conflict(
            "a conflicting row committed concurrently".into(),
        ));
    }
    Ok(BatchOutcome {
        inserted,
        already_present: present,
    })
}

#[async_trait]
impl Appends for PgStore {
    async fn append(&self, table_id: &TableId, record: &Record) -> StoreResult<AppendOutcome> {
        let def = self.definition(table_id).await?;
        let now = if def.writable_buckets.is_some() {
            self.now().await?
        } else {
            EventTime::min_supported()
        };
        let bucket = bucket_for_append(&def, record, now)?;
        let key = bucket.bucket_key.to_string();
        let (start, end) = bucket.bucket_key.bounds();
        let (start, end) = (start.to_datetime(), end.to_datetime());
        let time = record.event_time.to_datetime();
        let strategy = def.strategy.as_str();
        let (inserted, present, clash, state) = self
            .run("append", || async {
                let client = self.pooled().await?;
                let stmt = client.prepare_cached(APPEND_ONE_SQL).await?;
                let row = client
                    .query_one(
                        &stmt,
                        &[
                            &table_id.as_str(),
                            &record.partition_key.as_bytes(),
                            &key,
                            &strategy,
                            &start,
                            &end,
                            &time,
                            &record.sort_key.as_bytes(),
                            &record.value,
                        ],
                    )
                    .await
                    .map_err(append_error)?;
                let inserted: i64 = row.try_get(0)?;
                let present: i64 = row.try_get(1)?;
                let clash: i64 = row.try_get(2)?;
                let state: Option<String> = row.try_get(3)?;
                if inserted + present + clash == 0 && state.is_none() {
                    return Err(TxError::Conflict(
                        "a conflicting row committed concurrently".into(),
                    ));
                }
                Ok((inserted, present, clash, state))
            })
            .await?;
        if let Some(state) = state {
            return Err(StoreError::Fenced {
                bucket,
                state: state_name(&state)?,
            });
        }
        if clash > 0 {
            return Err(StoreError::DuplicateKey {
                bucket,
                event_time: record.event_time,
                sort_key: hex::encode(record.sort_key.as_bytes()),
            });
        }
        Ok(if inserted == 1 {
            AppendOutcome::Inserted
        } else if present == 1 {
            AppendOutcome::AlreadyPresent
        } else {
            return Err(StoreError::Corrupt(format!(
                "append into {bucket} reported {inserted} inserted and {present} present rows"
            )));
        })
    }

    async fn append_batch(
        &self,
        table_id: &TableId,
        records: &[Record],
    ) -> StoreResult<BatchOutcome> {
        self.append_records("append_batch", table_id, records).await
    }
}
