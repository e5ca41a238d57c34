//! Conformance cases for the store's append role (`Appends` in `src/store/roles.rs`):
//! a record commits only into a Hot bucket inside the table's writable guard, identical
//! retries are idempotent, a batch is all or nothing, and a claim fences every append
//! (ARCHITECTURE.md invariant 2), also under concurrent writers. Bad input is refused by
//! the model before it reaches the store, and the SQL `INSERT` on top of the store keeps
//! the batch's one-transaction promise.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pulpitum::model::{
    BucketId, BucketKey, BucketStrategy, EventTime, ModelError, PartitionKey, Record, SortKey,
    TableId, MAX_KEY_LEN,
};
use pulpitum::store::{
    AppendOutcome, BatchOutcome, BucketFilter, BucketState, StoreError, TableDefinition,
};

use super::{all_rows, bucket_of, pk, rec, snapshot_all, t, table, tid, Store, LONG};

/// Appending to an unregistered table is refused and writes nothing.
pub async fn append_to_unknown_table_is_refused(store: Store) {
    store.migrate().await.unwrap();
    let r = rec("p", t("2021-05-01T00:00:00Z"), b"k", b"v");
    assert!(matches!(
        store.append(&tid("ghost"), &r).await,
        Err(StoreError::UnknownTable(_))
    ));
    assert!(store
        .list_buckets(&tid("ghost"), &BucketFilter::default())
        .await
        .unwrap()
        .is_empty());
}

/// The first append creates the bucket as Hot with generation 0; the row reads back.
pub async fn append_creates_hot_bucket(store: Store) {
    let s = BucketStrategy::CalendarMonthUtc;
    let tbl = table(&store, "events", s).await;
    let r = rec("chan", t("2021-05-03T10:00:00.123456Z"), b"m1", b"hello");
    assert_eq!(
        store.append(&tbl, &r).await.unwrap(),
        AppendOutcome::Inserted
    );
    let b = bucket_of(&tbl, s, &r);
    assert_eq!(b.bucket_key.to_string(), "month:2021-05");
    let meta = store.bucket(&b).await.unwrap().unwrap();
    assert_eq!(meta.state, BucketState::Hot);
    assert_eq!(meta.generation, 0);
    assert_eq!(meta.owner_token, None);
    assert_eq!(all_rows(&store, &b).await, vec![r]);
}

/// An identical retry is AlreadyPresent; another value under the key is DuplicateKey and
/// leaves the original in place.
pub async fn duplicate_appends(store: Store) {
    let s = BucketStrategy::CalendarYearUtc;
    let tbl = table(&store, "events", s).await;
    let r = rec("chan", t("2021-05-03T10:00:00Z"), b"m1", b"hello");
    assert_eq!(
        store.append(&tbl, &r).await.unwrap(),
        AppendOutcome::Inserted
    );
    assert_eq!(
        store.append(&tbl, &r).await.unwrap(),
        AppendOutcome::AlreadyPresent
    );
    let other = Record {
        value: b"changed".to_vec(),
        ..r.clone()
    };
    match store.append(&tbl, &other).await {
        Err(StoreError::DuplicateKey {
            event_time,
            sort_key,
            ..
        }) => {
            assert_eq!(event_time, r.event_time);
            assert_eq!(sort_key, hex::encode(b"m1"));
        }
        x => panic!("expected DuplicateKey, got {x:?}"),
    }
    // Same time, other sort key: a distinct record.
    let sibling = rec("chan", r.event_time, b"m2", b"hello");
    assert_eq!(
        store.append(&tbl, &sibling).await.unwrap(),
        AppendOutcome::Inserted
    );
    assert_eq!(
        all_rows(&store, &bucket_of(&tbl, s, &r)).await,
        vec![r, sibling]
    );
}

/// The writable-bucket guard refuses appends older than the newest N buckets, by the
/// store's clock, and writes nothing for them.
pub async fn writable_bucket_guard(store: Store) {
    store.migrate().await.unwrap();
    let s = BucketStrategy::CalendarDayUtc;
    let def = TableDefinition {
        writable_buckets: Some(2),
        ..TableDefinition::new(tid("guarded"), s, "raw")
    };
    store.register_table(&def).await.unwrap();
    let now = store.now().await.unwrap();
    let today = s.bucket_of(now);
    let yesterday = today.prev().unwrap();
    let older = yesterday.prev().unwrap();
    let at = |k: BucketKey| EventTime::from_micros(k.start().as_micros() + 1_000).unwrap();
    let ok1 = rec("p", at(today), b"a", b"1");
    let ok2 = rec("p", at(yesterday), b"a", b"1");
    let bad = rec("p", at(older), b"a", b"1");
    assert_eq!(
        store.append(&def.table_id, &ok1).await.unwrap(),
        AppendOutcome::Inserted
    );
    assert_eq!(
        store.append(&def.table_id, &ok2).await.unwrap(),
        AppendOutcome::Inserted
    );
    match store.append(&def.table_id, &bad).await {
        Err(StoreError::NotWritable {
            writable_buckets,
            bucket,
            oldest,
            ..
        }) => {
            assert_eq!(writable_buckets, 2);
            assert_eq!(bucket.bucket_key, older);
            assert_eq!(oldest, yesterday);
        }
        x => panic!("expected NotWritable, got {x:?}"),
    }
    // Buckets after the store's "now" (beyond the clock allowance) are refused too, with an
    // error naming the bucket and the accepted range; nothing is written for them.
    let after_tomorrow = today.next().unwrap().next().unwrap();
    let far = s.bucket_of(t("2199-06-01T00:00:00Z"));
    for key in [after_tomorrow, far] {
        let future = rec("p", at(key), b"f", b"1");
        match store.append(&def.table_id, &future).await {
            Err(e @ StoreError::NotWritable { .. }) => {
                let StoreError::NotWritable {
                    bucket,
                    oldest,
                    newest,
                    ..
                } = &e
                else {
                    unreachable!()
                };
                assert_eq!(bucket.bucket_key, key);
                assert_eq!(*oldest, yesterday);
                assert!(*newest == today || Some(*newest) == today.next(), "{e}");
                let msg = e.to_string();
                assert!(
                    msg.contains(&key.to_string())
                        && msg.contains(&yesterday.to_string())
                        && msg.contains(&newest.to_string()),
                    "{msg}"
                );
            }
            x => panic!("expected NotWritable for {key}, got {x:?}"),
        }
        assert!(matches!(
            store
                .append_batch(&def.table_id, &[rec("p", at(today), b"c", b"3"), future])
                .await,
            Err(StoreError::NotWritable { .. })
        ));
    }
    // A batch holding one too-old record is refused whole.
    let fresh = rec("p", at(today), b"b", b"2");
    assert!(matches!(
        store
            .append_batch(&def.table_id, &[fresh.clone(), bad.clone()])
            .await,
        Err(StoreError::NotWritable { .. })
    ));
    let buckets = store
        .list_buckets(&def.table_id, &BucketFilter::default())
        .await
        .unwrap();
    let keys: Vec<BucketKey> = buckets.iter().map(|m| m.id.bucket_key).collect();
    assert_eq!(keys, vec![yesterday, today]);
    assert_eq!(
        all_rows(&store, &BucketId::of_record(&def.table_id, s, &ok1)).await,
        vec![ok1]
    );
}

/// A batch commits entirely or not at all: a fenced bucket or a conflicting key anywhere in
/// it rejects every record, including the ones for new buckets.
pub async fn batch_is_all_or_nothing(store: Store) {
    let s = BucketStrategy::CalendarMonthUtc;
    let tbl = table(&store, "events", s).await;
    let a1 = rec("p", t("2021-01-10T00:00:00Z"), b"1", b"a");
    let b1 = rec("p", t("2021-02-10T00:00:00Z"), b"1", b"b");
    let out = store
        .append_batch(&tbl, &[a1.clone(), b1.clone()])
        .await
        .unwrap();
    assert_eq!(
        out,
        BatchOutcome {
            inserted: 2,
            already_present: 0
        }
    );
    // Retry of the same batch plus one new record: identical rows count as present.
    let a2 = rec("p", t("2021-01-11T00:00:00Z"), b"2", b"a2");
    let out = store
        .append_batch(&tbl, &[a1.clone(), b1.clone(), a2.clone(), a2.clone()])
        .await
        .unwrap();
    assert_eq!(
        out,
        BatchOutcome {
            inserted: 1,
            already_present: 3
        }
    );

    // One record conflicting with a stored one: nothing of the batch lands.
    let c1 = rec("p", t("2021-03-10T00:00:00Z"), b"1", b"c");
    let a3 = rec("p", t("2021-01-12T00:00:00Z"), b"3", b"a3");
    let clash = Record {
        value: b"different".to_vec(),
        ..b1.clone()
    };
    assert!(matches!(
        store
            .append_batch(&tbl, &[c1.clone(), a3.clone(), clash])
            .await,
        Err(StoreError::DuplicateKey { .. })
    ));
    // Two different values for one key inside the batch itself.
    let d1 = rec("p", t("2021-04-10T00:00:00Z"), b"1", b"x");
    let d1b = Record {
        value: b"y".to_vec(),
        ..d1.clone()
    };
    assert!(matches!(
        store.append_batch(&tbl, &[d1.clone(), d1b]).await,
        Err(StoreError::DuplicateKey { .. })
    ));

    // Fence bucket February, then a batch touching January, February and a new March.
    let feb = bucket_of(&tbl, s, &b1);
    let claim = store.claim(&feb, LONG).await.unwrap().expect("claimable");
    let b2 = rec("p", t("2021-02-11T00:00:00Z"), b"2", b"b2");
    match store
        .append_batch(&tbl, &[a3.clone(), b2, c1.clone()])
        .await
    {
        Err(StoreError::Fenced { bucket, state }) => {
            assert_eq!(bucket, feb);
            assert_eq!(state, "archiving");
        }
        x => panic!("expected Fenced, got {x:?}"),
    }
    let jan = bucket_of(&tbl, s, &a1);
    assert_eq!(all_rows(&store, &jan).await, vec![a1, a2]);
    assert_eq!(snapshot_all(&store, &claim, 10).await, vec![b1]);
    for absent in [&c1, &d1] {
        let b = bucket_of(&tbl, s, absent);
        assert_eq!(store.bucket(&b).await.unwrap(), None, "no metadata for {b}");
    }
    assert_eq!(
        store.append_batch(&tbl, &[]).await.unwrap(),
        BatchOutcome::default()
    );
}

// ---------------------------------------------------------------------------------------
// the fence under concurrency

/// Invariant 2 under load: 8 writers append continuously into one bucket while a claim
/// fences it; the snapshot holds exactly the acknowledged appends. 20 rounds.
pub async fn fence_under_concurrency(store: Store) {
    let s = BucketStrategy::CalendarYearUtc;
    let tbl = table(&store, "events", s).await;
    for round in 0..20u32 {
        let partition = format!("round{round}");
        let acked = Arc::new(Mutex::new(BTreeSet::<Vec<u8>>::new()));
        let rejected = Arc::new(Mutex::new(BTreeSet::<Vec<u8>>::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let acked_n = Arc::new(AtomicU64::new(0));
        let rejected_n = Arc::new(AtomicU64::new(0));
        let base = t("2021-03-01T00:00:00Z").as_micros();
        let mut writers = Vec::new();
        for w in 0..8u8 {
            let (store, tbl, partition) = (store.clone(), tbl.clone(), partition.clone());
            let (acked, rejected, stop) = (acked.clone(), rejected.clone(), stop.clone());
            let (acked_n, rejected_n) = (acked_n.clone(), rejected_n.clone());
            writers.push(tokio::spawn(async move {
                let mut seq: u32 = 0;
                while !stop.load(Ordering::SeqCst) {
                    seq += 1;
                    let mut key = vec![w];
                    key.extend_from_slice(&seq.to_be_bytes());
                    let time =
                        EventTime::from_micros(base + i64::from(seq) * 10 + i64::from(w)).unwrap();
                    let r = rec(&partition, time, &key, &key);
                    match store.append(&tbl, &r).await {
                        Ok(AppendOutcome::Inserted) => {
                            acked.lock().unwrap().insert(key);
                            acked_n.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(AppendOutcome::AlreadyPresent) => panic!("fresh key reported present"),
                        // Both leave nothing committed: a fence, or conflicts past the budget
                        // (the last attempt was rolled back).
                        Err(StoreError::Fenced { .. })
                        | Err(StoreError::RetriesExhausted { .. }) => {
                            rejected.lock().unwrap().insert(key);
                            rejected_n.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => panic!("writer {w}: unexpected error {e:?}"),
                    }
                }
            }));
        }
        while acked_n.load(Ordering::SeqCst) < 16 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let b = BucketId {
            table_id: tbl.clone(),
            partition_key: pk(&partition),
            bucket_key: s.bucket_of(EventTime::from_micros(base).unwrap()),
        };
        let claim = store.claim(&b, LONG).await.unwrap().expect("claim");
        // Snapshot while the writers keep trying: anything they commit from now on would be
        // missing from it.
        let snap = snapshot_all(&store, &claim, 64).await;
        let after_snapshot = rejected_n.load(Ordering::SeqCst);
        // Let the writers hit the fence a few times (bounded: a broken fence never does).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while rejected_n.load(Ordering::SeqCst) < after_snapshot + 16
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        stop.store(true, Ordering::SeqCst);
        for w in writers {
            w.await.unwrap();
        }
        let acked = acked.lock().unwrap().clone();
        let rejected = rejected.lock().unwrap().clone();
        let snap_keys: BTreeSet<Vec<u8>> = snap
            .iter()
            .map(|r| r.sort_key.as_bytes().to_vec())
            .collect();
        assert_eq!(
            snap_keys.len(),
            snap.len(),
            "round {round}: snapshot has duplicates"
        );
        let lost: Vec<_> = acked.difference(&snap_keys).collect();
        assert!(
            lost.is_empty(),
            "round {round}: {} acknowledged appends missing from the snapshot",
            lost.len()
        );
        let ghosts: Vec<_> = snap_keys.intersection(&rejected).collect();
        assert!(
            ghosts.is_empty(),
            "round {round}: {} rejected appends present",
            ghosts.len()
        );
        assert_eq!(
            snap_keys, acked,
            "round {round}: snapshot equals the acknowledged set"
        );
        assert!(!rejected.is_empty());
        // Nothing slipped in after the snapshot either.
        let final_rows = snapshot_all(&store, &claim, 1000).await;
        assert_eq!(
            final_rows, snap,
            "round {round}: rows changed after the fence"
        );
    }
}

// ---------------------------------------------------------------------------------------
// bad input

/// Malformed bucket keys, oversized keys, sub-microsecond times and unknown strategies are
/// typed errors before any I/O, and nothing is written.
pub async fn bad_input_is_typed_and_writes_nothing(store: Store) {
    store.migrate().await.unwrap();
    for bad in [
        "year:24",
        "year:2024-01",
        "month:2024-1",
        "day:2024-02-30",
        "week:2024-01",
        "Year:2024",
        "year:1899",
        "",
    ] {
        assert!(
            matches!(
                BucketKey::parse_any(bad),
                Err(ModelError::MalformedBucketKey { .. })
            ),
            "{bad:?} must be refused"
        );
    }
    assert!(matches!(
        BucketKey::parse(BucketStrategy::CalendarDayUtc, "month:2024-01"),
        Err(ModelError::MalformedBucketKey { .. })
    ));
    assert!(matches!(
        PartitionKey::new(vec![1; MAX_KEY_LEN + 1]),
        Err(ModelError::InvalidKey {
            kind: "partition",
            ..
        })
    ));
    assert!(matches!(
        SortKey::new(vec![1; MAX_KEY_LEN + 1]),
        Err(ModelError::InvalidKey { kind: "sort", .. })
    ));
    assert!(matches!(
        PartitionKey::new(Vec::new()),
        Err(ModelError::InvalidKey { .. })
    ));
    assert!(matches!(
        EventTime::from_nanos(1_622_505_600_000_000_001),
        Err(ModelError::SubMicrosecondTime(_))
    ));
    assert!(matches!(
        EventTime::parse_rfc3339("2021-06-01T00:00:00.0000001Z"),
        Err(ModelError::SubMicrosecondTime(_))
    ));
    assert!(matches!(
        "calendar_week_utc".parse::<BucketStrategy>(),
        Err(ModelError::UnknownStrategy(_))
    ));
    assert!(matches!(
        TableId::new("Bad-Name"),
        Err(ModelError::InvalidTableId { .. })
    ));
    // Model errors convert into the store's typed error.
    let e: StoreError = ModelError::UnknownStrategy("x".into()).into();
    assert!(matches!(
        e,
        StoreError::Model(ModelError::UnknownStrategy(_))
    ));
    // Keys at the maximum length are accepted and round-trip.
    let tbl = table(&store, "events", BucketStrategy::CalendarYearUtc).await;
    let big = Record {
        partition_key: PartitionKey::new(vec![0xab; MAX_KEY_LEN]).unwrap(),
        event_time: t("2021-06-01T00:00:00.000001Z"),
        sort_key: SortKey::new(vec![0xcd; MAX_KEY_LEN]).unwrap(),
        value: vec![0; 1 << 16],
    };
    assert_eq!(
        store.append(&tbl, &big).await.unwrap(),
        AppendOutcome::Inserted
    );
    let b = bucket_of(&tbl, BucketStrategy::CalendarYearUtc, &big);
    assert_eq!(all_rows(&store, &b).await, vec![big]);
    // Nothing else was written by the refused inputs.
    assert_eq!(
        store
            .list_buckets(&tbl, &BucketFilter::default())
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(store.tables().await.unwrap().len(), 1);
}

// ---------------------------------------------------------------------------------------
// the SQL INSERT on top of the store

/// `INSERT INTO ... VALUES` of `rows` chat rows on channel 1: `(ts, id, content)`.
fn insert_sql(table: &str, rows: &[(String, i64, String)]) -> String {
    let values: Vec<String> = rows
        .iter()
        .map(|(ts, id, c)| format!("(1, TIMESTAMP '{ts}', {id}, '{c}')"))
        .collect();
    format!("INSERT INTO {table} VALUES {}", values.join(", "))
}

/// `n` rows spread over the first five days of May 2024 (five new buckets), ids from `from`.
fn spread_rows(n: i64, from: i64) -> Vec<(String, i64, String)> {
    (0..n)
        .map(|i| {
            let id = from + i;
            (
                format!("2024-05-0{}T00:00:{:02}.{:06}Z", 1 + id % 5, id % 60, id),
                id,
                format!("m{id}"),
            )
        })
        .collect()
}

async fn sql_count(ctx: &datafusion::prelude::SessionContext, sql: &str) -> Result<u64, String> {
    use datafusion::arrow::array::{Array, Int64Array, UInt64Array};
    let batches = ctx
        .sql(sql)
        .await
        .map_err(|e| e.to_string())?
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    let col = batches[0].column(0);
    if let Some(a) = col.as_any().downcast_ref::<UInt64Array>() {
        return Ok(a.value(0));
    }
    let a = col.as_any().downcast_ref::<Int64Array>().expect("a count");
    Ok(a.value(0) as u64)
}

/// An `INSERT` statement is one transaction over every bucket it touches, whatever its
/// size: a fenced bucket or a conflicting key in its LAST rows (past what used to be the
/// first commits of a 500-row batching) leaves nothing of it behind; a statement above
/// the row cap fails before writing; the count is the rows actually inserted.
pub async fn sql_insert_is_one_transaction(store: Store) {
    use pulpitum::archive::ArchiveStore;
    use pulpitum::session::{session, SessionOptions};
    let archive = Arc::new(ArchiveStore::from_url("memory://").unwrap());
    let opts = SessionOptions {
        max_insert_rows: 1_300,
        ..SessionOptions::default()
    };
    store.migrate().await.unwrap();
    let ctx = session(store.clone(), archive, opts).await.unwrap();
    ctx.sql(
        "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' \
         OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')",
    )
    .await
    .unwrap();
    let tbl = tid("chat");
    let count_all = "SELECT count(*) FROM chat";
    let buckets = |store: Store| {
        let tbl = tbl.clone();
        async move {
            store
                .list_buckets(&tbl, &BucketFilter::default())
                .await
                .unwrap()
                .len()
        }
    };

    // One stored row on 2024-05-10; its bucket will be fenced.
    let first = vec![("2024-05-10T12:00:00Z".to_string(), 0, "kept".to_string())];
    assert_eq!(sql_count(&ctx, &insert_sql("chat", &first)).await, Ok(1));

    // 1,200 rows over five new buckets whose LAST row reuses the stored key with another
    // value: nothing of the statement commits.
    let mut rows = spread_rows(1_199, 1);
    rows.push(("2024-05-10T12:00:00Z".into(), 0, "changed".into()));
    let err = sql_count(&ctx, &insert_sql("chat", &rows))
        .await
        .unwrap_err();
    assert!(err.contains("a different record already exists"), "{err}");
    assert_eq!(sql_count(&ctx, count_all).await, Ok(1), "after {err}");
    assert_eq!(buckets(store.clone()).await, 1);

    // Fence 2024-05-10, then 1,200 rows whose last ten land in it: nothing commits, no
    // bucket of the statement is even created.
    let fenced = store
        .list_buckets(&tbl, &BucketFilter::default())
        .await
        .unwrap()
        .pop()
        .unwrap()
        .id;
    let claim = store
        .claim(&fenced, LONG)
        .await
        .unwrap()
        .expect("claimable");
    let mut rows = spread_rows(1_190, 1);
    rows.extend((0..10).map(|i| {
        (
            format!("2024-05-10T13:00:0{i}Z"),
            5_000 + i,
            "late".to_string(),
        )
    }));
    let err = sql_count(&ctx, &insert_sql("chat", &rows))
        .await
        .unwrap_err();
    assert!(err.contains("is archiving: writes are fenced"), "{err}");
    assert_eq!(sql_count(&ctx, count_all).await, Ok(1), "after {err}");
    assert_eq!(buckets(store.clone()).await, 1);

    // Above the cap: refused before anything is written, with the cap in the message.
    let err = sql_count(&ctx, &insert_sql("chat", &spread_rows(1_301, 1)))
        .await
        .unwrap_err();
    assert!(
        err.contains("exceeds max_insert_rows = 1300") && err.contains("nothing was written"),
        "{err}"
    );
    assert_eq!(sql_count(&ctx, count_all).await, Ok(1));

    // At the cap it commits, all of it; the count is rows inserted, so the same statement
    // again (a retry) reports 0, and a statement half new, half retried reports the half.
    let ok = insert_sql("chat", &spread_rows(1_300, 1));
    assert_eq!(sql_count(&ctx, &ok).await, Ok(1_300));
    assert_eq!(sql_count(&ctx, &ok).await, Ok(0));
    assert_eq!(
        sql_count(&ctx, &insert_sql("chat", &spread_rows(1_000, 1_001))).await,
        Ok(700)
    );
    assert_eq!(sql_count(&ctx, count_all).await, Ok(2_001));
    assert_eq!(buckets(store.clone()).await, 6);
    store.defer_archive(&claim, Duration::ZERO).await.unwrap();
}

/// A write inside a statement its caller has abandoned (a wire timeout that came first)
/// commits nothing and says so; a write that reached its commit first commits, and the
/// statement can no longer be abandoned (its caller waits for the outcome instead).
pub async fn a_write_of_an_abandoned_statement_commits_nothing(store: Store) {
    use pulpitum::store::gate::{within, CommitGate};

    let tbl = table(&store, "events", BucketStrategy::CalendarDayUtc).await;
    let r = rec("p", t("2024-03-10T12:00:00Z"), b"s1", b"v1");
    let gate = CommitGate::new();
    assert!(gate.abandon());
    let refused = within(gate, store.append_batch(&tbl, std::slice::from_ref(&r))).await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(
        store
            .list_buckets(&tbl, &BucketFilter::default())
            .await
            .unwrap()
            .is_empty(),
        "an abandoned append left a bucket"
    );
    let gate = CommitGate::new();
    let done = within(
        gate.clone(),
        store.append_batch(&tbl, std::slice::from_ref(&r)),
    )
    .await
    .unwrap();
    assert_eq!(done.inserted, 1);
    assert!(
        !gate.abandon(),
        "a committed write's statement was abandoned"
    );
    let bucket = bucket_of(&tbl, BucketStrategy::CalendarDayUtc, &r);
    assert_eq!(all_rows(&store, &bucket).await, vec![r]);
}
