//! The hot-store conformance suite: behaviour every [`HotStore`] must share, whatever its
//! backend. Each case takes a fresh, empty store (its own schema or file) and asserts the
//! contract of `src/store/mod.rs`: the fence (ARCHITECTURE.md invariant 2), claim checks
//! in the writing statement (3), one route per read (7) and idempotent steps (9).
//!
//! A test binary runs each case once per backend, e.g.
//! `conformance::fence_under_concurrency(store).await` inside a `#[tokio::test]`. Cases that
//! wait for leases to expire use leases of a few hundred milliseconds, and need a
//! multi-threaded runtime only for the concurrency cases.

#![allow(dead_code)]

/// Invokes `$runner!` with every case of the suite. Each store's test file defines its runner
/// (how to build a fresh store) and calls this once, so a case added here runs on both stores.
macro_rules! every_case {
    ($runner:ident) => {
        $runner!(
            migrate_is_idempotent,
            register_table_is_immutable,
            append_to_unknown_table_is_refused,
            append_creates_hot_bucket,
            duplicate_appends,
            writable_bucket_guard,
            batch_is_all_or_nothing,
            full_lifecycle,
            defer_archive_sets_retry_time,
            expired_lease_is_rejected,
            stale_token_and_generation_are_rejected,
            wrong_state_transitions_are_rejected,
            cleanup_lease_expires,
            renew_extends_the_lease,
            fence_under_concurrency,
            racing_claimers,
            read_page_matches_reference,
            read_page_missing_and_empty,
            list_buckets_filters,
            read_head_matches_listing_and_page,
            read_head_finds_the_first_bucket_of_a_long_history,
            discover_orders_and_limits,
            backlog_counts_eligible_and_archiving,
            bad_input_is_typed_and_writes_nothing,
            sql_insert_is_one_transaction,
        );
    };
}

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pulpitum::model::{batch_to_records, records_to_batch};
use pulpitum::model::{
    BucketId, BucketKey, BucketStrategy, ClusteringKey, EventTime, ModelError, PartitionKey,
    Record, ScanBounds, SortKey, TableId, MAX_KEY_LEN,
};
use pulpitum::store::{
    AppendOutcome, Backlog, BatchOutcome, BucketFilter, BucketState, Claim, HotPage, HotStore,
    PageRequest, RoutedBucket, StoreError, TableDefinition, WorkKind,
};

/// A store under test.
pub type Store = Arc<dyn HotStore>;

const LONG: Duration = Duration::from_secs(60);
const SHORT: Duration = Duration::from_millis(300);
const PAST_SHORT: Duration = Duration::from_millis(450);

// ---------------------------------------------------------------------------------------
// helpers

fn tid(s: &str) -> TableId {
    TableId::new(s).unwrap()
}

fn pk(s: &str) -> PartitionKey {
    PartitionKey::new(s.as_bytes().to_vec()).unwrap()
}

fn t(s: &str) -> EventTime {
    EventTime::parse_rfc3339(s).unwrap()
}

fn rec(p: &str, time: EventTime, sort: &[u8], value: &[u8]) -> Record {
    Record {
        partition_key: pk(p),
        event_time: time,
        sort_key: SortKey::new(sort.to_vec()).unwrap(),
        value: value.to_vec(),
    }
}

async fn table(store: &Store, name: &str, strategy: BucketStrategy) -> TableId {
    store.migrate().await.unwrap();
    let def = TableDefinition::new(tid(name), strategy, "raw");
    store.register_table(&def).await.unwrap();
    def.table_id
}

fn bucket_of(table: &TableId, strategy: BucketStrategy, r: &Record) -> BucketId {
    BucketId::of_record(table, strategy, r)
}

async fn all_rows(store: &Store, b: &BucketId) -> Vec<Record> {
    match store
        .read_page(
            b,
            &PageRequest {
                bounds: ScanBounds::all(),
                descending: false,
                limit: 1_000_000,
                include_value: true,
            },
        )
        .await
        .unwrap()
    {
        HotPage::Hot { rows, .. } => batch_to_records(&rows).unwrap(),
        HotPage::Missing => Vec::new(),
        other => panic!("expected hot rows, got {other:?}"),
    }
}

async fn snapshot_all(store: &Store, claim: &Claim, page: usize) -> Vec<Record> {
    let mut out: Vec<Record> = Vec::new();
    loop {
        let after = out.last().map(|r| r.clustering_key());
        let rows = store
            .snapshot_page(claim, after.as_ref(), page)
            .await
            .unwrap();
        let n = rows.len();
        out.extend(rows);
        if n < page {
            return out;
        }
    }
}

fn assert_stale<T: std::fmt::Debug>(r: Result<T, StoreError>, what: &str) {
    match r {
        Err(StoreError::StaleClaim { .. }) => {}
        other => panic!("{what}: expected StaleClaim, got {other:?}"),
    }
}

fn assert_invalid<T: std::fmt::Debug>(r: Result<T, StoreError>, what: &str) {
    match r {
        Err(StoreError::InvalidTransition { .. }) => {}
        other => panic!("{what}: expected InvalidTransition, got {other:?}"),
    }
}

fn state_of(meta: &Option<pulpitum::store::BucketMeta>) -> &'static str {
    meta.as_ref().expect("bucket metadata").state.name()
}

// ---------------------------------------------------------------------------------------
// registry and migrations

/// Migrating twice is harmless.
pub async fn migrate_is_idempotent(store: Store) {
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    assert!(store.tables().await.unwrap().is_empty());
}

/// The identical definition twice is a no-op; another strategy is a conflict that changes
/// nothing.
pub async fn register_table_is_immutable(store: Store) {
    store.migrate().await.unwrap();
    let def = TableDefinition::new(tid("events"), BucketStrategy::CalendarMonthUtc, "raw");
    assert_eq!(store.register_table(&def).await.unwrap(), def);
    assert_eq!(store.register_table(&def).await.unwrap(), def);
    let other = TableDefinition {
        strategy: BucketStrategy::CalendarDayUtc,
        ..def.clone()
    };
    assert!(matches!(
        store.register_table(&other).await,
        Err(StoreError::TableConflict { .. })
    ));
    assert_eq!(store.table(&def.table_id).await.unwrap(), Some(def.clone()));
    assert_eq!(store.table(&tid("nope")).await.unwrap(), None);
    let second = TableDefinition {
        writable_buckets: Some(3),
        ..TableDefinition::new(tid("audit"), BucketStrategy::CalendarYearUtc, "chat")
    };
    store.register_table(&second).await.unwrap();
    assert_eq!(store.tables().await.unwrap(), vec![second, def]);
}

// ---------------------------------------------------------------------------------------
// appends

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
// the bucket lifecycle

/// Hot -> Archiving -> Archived -> cleaned, with the fence, the routes and the work list
/// observed at every step.
pub async fn full_lifecycle(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let tbl = table(&store, "events", s).await;
    let rows: Vec<Record> = (0..7)
        .map(|i| {
            rec(
                "p",
                EventTime::from_micros(t("2021-06-01T00:00:00Z").as_micros() + i).unwrap(),
                &[i as u8],
                b"v",
            )
        })
        .collect();
    store.append_batch(&tbl, &rows).await.unwrap();
    let b = bucket_of(&tbl, s, &rows[0]);
    let cutoff = t("2021-06-02T00:00:00Z");

    let work = store.discover(cutoff, 10).await.unwrap();
    assert_eq!(work.len(), 1);
    assert_eq!(
        (work[0].bucket.clone(), work[0].kind),
        (b.clone(), WorkKind::Eligible)
    );
    assert!(
        store
            .discover(t("2021-06-01T23:59:59Z"), 10)
            .await
            .unwrap()
            .is_empty(),
        "not ended by cutoff"
    );

    let claim = store.claim(&b, LONG).await.unwrap().expect("claim");
    assert_eq!(claim.generation, 1);
    assert!(claim.expires_at > store.now().await.unwrap());
    let meta = store.bucket(&b).await.unwrap().unwrap();
    assert_eq!(meta.state, BucketState::Archiving);
    assert_eq!(meta.owner_token.as_deref(), Some(claim.token.as_str()));
    assert_eq!(meta.generation, 1);
    assert!(
        store.claim(&b, LONG).await.unwrap().is_none(),
        "a live claim is exclusive"
    );
    assert!(
        store.discover(cutoff, 10).await.unwrap().is_empty(),
        "a live claim is not work"
    );

    let late = rec("p", t("2021-06-01T12:00:00Z"), b"late", b"v");
    assert!(matches!(
        store.append(&tbl, &late).await,
        Err(StoreError::Fenced {
            state: "archiving",
            ..
        })
    ));
    match store
        .read_page(
            &b,
            &PageRequest {
                bounds: ScanBounds::all(),
                descending: false,
                limit: 100,
                include_value: true,
            },
        )
        .await
        .unwrap()
    {
        HotPage::Hot { state, rows: got } => {
            assert_eq!(state, BucketState::Archiving);
            assert_eq!(batch_to_records(&got).unwrap(), rows);
        }
        x => panic!("expected archiving rows, got {x:?}"),
    }
    assert_eq!(snapshot_all(&store, &claim, 3).await, rows);
    let claim = store.renew(&claim, LONG).await.unwrap();

    store
        .publish_archive(&claim, "objects/g1/manifest.json")
        .await
        .unwrap();
    let meta = store.bucket(&b).await.unwrap().unwrap();
    assert_eq!(
        meta.state,
        BucketState::Archived {
            object_key: "objects/g1/manifest.json".into(),
            hot_deleted: false
        }
    );
    assert!(meta.published_at.is_some());
    assert_eq!(
        store
            .read_page(
                &b,
                &PageRequest {
                    bounds: ScanBounds::all(),
                    descending: false,
                    limit: 100,
                    include_value: true
                }
            )
            .await
            .unwrap(),
        HotPage::Archived {
            object_key: "objects/g1/manifest.json".into()
        }
    );
    assert!(matches!(
        store.append(&tbl, &late).await,
        Err(StoreError::Fenced {
            state: "archived",
            ..
        })
    ));
    assert!(
        store.claim(&b, LONG).await.unwrap().is_none(),
        "published buckets are never re-claimed"
    );
    assert_eq!(
        store.referenced_object_keys().await.unwrap(),
        vec!["objects/g1/manifest.json".to_string()]
    );
    let work = store.discover(cutoff, 10).await.unwrap();
    assert_eq!(work.len(), 1);
    assert_eq!(work[0].kind, WorkKind::CleanupPending);

    let cleaner = store
        .claim_cleanup(&b, LONG)
        .await
        .unwrap()
        .expect("cleanup claim");
    assert_eq!(cleaner.generation, 2);
    assert!(
        store.claim_cleanup(&b, LONG).await.unwrap().is_none(),
        "cleanup claim is exclusive"
    );
    assert!(store.discover(cutoff, 10).await.unwrap().is_empty());
    let mut deleted = 0;
    let mut steps = 0;
    loop {
        let (n, done) = store
            .cleanup_step(&cleaner, 3, Duration::ZERO)
            .await
            .unwrap();
        deleted += n;
        steps += 1;
        assert!(n <= 3, "cleanup steps are bounded by the limit");
        if done {
            break;
        }
        assert!(steps < 10);
    }
    assert_eq!(deleted, 7);
    assert!(
        steps >= 3,
        "seven rows in chunks of three take at least three steps"
    );
    let meta = store.bucket(&b).await.unwrap().unwrap();
    assert_eq!(
        meta.state,
        BucketState::Archived {
            object_key: "objects/g1/manifest.json".into(),
            hot_deleted: true
        }
    );
    // Idempotent retry of the last step.
    assert_eq!(
        store
            .cleanup_step(&cleaner, 3, Duration::ZERO)
            .await
            .unwrap(),
        (0, true)
    );
    assert!(store.claim_cleanup(&b, LONG).await.unwrap().is_none());
    assert!(store.discover(cutoff, 10).await.unwrap().is_empty());
    assert_eq!(
        store
            .read_page(
                &b,
                &PageRequest {
                    bounds: ScanBounds::all(),
                    descending: false,
                    limit: 100,
                    include_value: true
                }
            )
            .await
            .unwrap(),
        HotPage::Archived {
            object_key: "objects/g1/manifest.json".into()
        }
    );
}

/// A deferred bucket goes back to Hot, accepts appends, and is claimable (generation + 1)
/// only after its durable retry time.
pub async fn defer_archive_sets_retry_time(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let tbl = table(&store, "events", s).await;
    let r = rec("p", t("2021-06-01T00:00:00Z"), b"1", b"v");
    store.append(&tbl, &r).await.unwrap();
    let b = bucket_of(&tbl, s, &r);
    let claim = store.claim(&b, LONG).await.unwrap().unwrap();
    store
        .defer_archive(&claim, Duration::from_millis(400))
        .await
        .unwrap();
    let meta = store.bucket(&b).await.unwrap().unwrap();
    assert_eq!(meta.state, BucketState::Hot);
    assert_eq!(meta.owner_token, None);
    assert!(meta.retry_at.unwrap() > store.now().await.unwrap());
    assert!(
        store.claim(&b, LONG).await.unwrap().is_none(),
        "retry time not reached"
    );
    assert!(store
        .discover(t("2030-01-01T00:00:00Z"), 10)
        .await
        .unwrap()
        .is_empty());
    let r2 = rec("p", t("2021-06-01T00:00:01Z"), b"2", b"v");
    assert_eq!(
        store.append(&tbl, &r2).await.unwrap(),
        AppendOutcome::Inserted
    );
    // The deferring claim is spent.
    assert_invalid(
        store.publish_archive(&claim, "k").await,
        "publish after defer",
    );
    assert_invalid(store.defer_archive(&claim, LONG).await, "defer twice");
    tokio::time::sleep(Duration::from_millis(550)).await;
    let work = store.discover(t("2030-01-01T00:00:00Z"), 10).await.unwrap();
    assert_eq!(work.len(), 1);
    assert_eq!(work[0].kind, WorkKind::Eligible);
    let again = store
        .claim(&b, LONG)
        .await
        .unwrap()
        .expect("claimable after retry time");
    assert_eq!(again.generation, 2);
    assert_eq!(snapshot_all(&store, &again, 10).await, vec![r, r2]);
}

// ---------------------------------------------------------------------------------------
// rejections

/// A claim whose lease expired can no longer snapshot, renew, defer or publish, even
/// before anyone else claims; the bucket shows up as an expired claim and is re-claimed
/// with generation + 1, after which the old claim is stale by generation.
pub async fn expired_lease_is_rejected(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let tbl = table(&store, "events", s).await;
    let r = rec("p", t("2021-06-01T00:00:00Z"), b"1", b"v");
    store.append(&tbl, &r).await.unwrap();
    let b = bucket_of(&tbl, s, &r);
    let old = store.claim(&b, SHORT).await.unwrap().unwrap();
    assert_eq!(
        store.snapshot_page(&old, None, 10).await.unwrap(),
        vec![r.clone()]
    );
    tokio::time::sleep(PAST_SHORT).await;
    assert_stale(
        store.snapshot_page(&old, None, 10).await,
        "snapshot after expiry",
    );
    assert_stale(store.renew(&old, LONG).await, "renew after expiry");
    assert_stale(store.defer_archive(&old, LONG).await, "defer after expiry");
    assert_stale(
        store.publish_archive(&old, "k").await,
        "publish after expiry",
    );
    assert_eq!(state_of(&store.bucket(&b).await.unwrap()), "archiving");
    assert!(matches!(
        store
            .append(&tbl, &rec("p", r.event_time, b"2", b"v"))
            .await,
        Err(StoreError::Fenced { .. })
    ));
    let work = store.discover(t("2021-01-01T00:00:00Z"), 10).await.unwrap();
    assert_eq!(work.len(), 1);
    assert_eq!(work[0].kind, WorkKind::ExpiredClaim);

    let new = store
        .claim(&b, LONG)
        .await
        .unwrap()
        .expect("expired claim is re-claimable");
    assert_eq!(new.generation, old.generation + 1);
    assert_ne!(new.token, old.token);
    assert_stale(
        store.snapshot_page(&old, None, 10).await,
        "old generation snapshot",
    );
    assert_stale(
        store.publish_archive(&old, "k").await,
        "old generation publish",
    );
    store.publish_archive(&new, "k2").await.unwrap();
    assert_eq!(
        store.referenced_object_keys().await.unwrap(),
        vec!["k2".to_string()]
    );
}

/// A forged or stale token or generation is rejected by every step, and rejection writes
/// nothing.
pub async fn stale_token_and_generation_are_rejected(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let tbl = table(&store, "events", s).await;
    let r = rec("p", t("2021-06-01T00:00:00Z"), b"1", b"v");
    store.append(&tbl, &r).await.unwrap();
    let b = bucket_of(&tbl, s, &r);
    let claim = store.claim(&b, LONG).await.unwrap().unwrap();
    let wrong_token = Claim {
        token: "0".repeat(32),
        ..claim.clone()
    };
    let wrong_gen = Claim {
        generation: claim.generation + 1,
        ..claim.clone()
    };
    let older_gen = Claim {
        generation: claim.generation - 1,
        ..claim.clone()
    };
    for bad in [&wrong_token, &wrong_gen, &older_gen] {
        assert_stale(store.snapshot_page(bad, None, 10).await, "snapshot");
        assert_stale(store.renew(bad, LONG).await, "renew");
        assert_stale(store.defer_archive(bad, LONG).await, "defer");
        assert_stale(store.publish_archive(bad, "forged").await, "publish");
    }
    let meta = store.bucket(&b).await.unwrap().unwrap();
    assert_eq!(meta.state, BucketState::Archiving);
    assert_eq!(meta.generation, claim.generation);
    assert!(store.referenced_object_keys().await.unwrap().is_empty());
    store.publish_archive(&claim, "real").await.unwrap();
    let cleaner = store.claim_cleanup(&b, LONG).await.unwrap().unwrap();
    let forged = Claim {
        token: "f".repeat(32),
        ..cleaner.clone()
    };
    assert_stale(
        store.cleanup_step(&forged, 10, Duration::ZERO).await,
        "cleanup forged token",
    );
    // The archiving claim's generation is now behind the cleanup claim's.
    assert_stale(
        store.cleanup_step(&claim, 10, Duration::ZERO).await,
        "cleanup with old claim",
    );
    assert_eq!(all_rows_ignoring_route(&store, &b, &cleaner).await, 1);
}

async fn all_rows_ignoring_route(store: &Store, b: &BucketId, cleaner: &Claim) -> usize {
    // Rows are still there: a refused cleanup deleted nothing. Count them by cleaning now.
    let (n, done) = store
        .cleanup_step(cleaner, 100, Duration::ZERO)
        .await
        .unwrap();
    assert!(done);
    assert_eq!(state_of(&store.bucket(b).await.unwrap()), "archived");
    n as usize
}

/// Transitions the state does not allow: publish twice, cleanup before publish, cleanup
/// before the minimum age, snapshot or defer after publish, cleanup claims on Hot buckets.
pub async fn wrong_state_transitions_are_rejected(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let tbl = table(&store, "events", s).await;
    let r = rec("p", t("2021-06-01T00:00:00Z"), b"1", b"v");
    store.append(&tbl, &r).await.unwrap();
    let b = bucket_of(&tbl, s, &r);
    assert!(
        store.claim_cleanup(&b, LONG).await.unwrap().is_none(),
        "hot bucket has no cleanup"
    );
    let claim = store.claim(&b, LONG).await.unwrap().unwrap();
    assert!(
        store.claim_cleanup(&b, LONG).await.unwrap().is_none(),
        "archiving bucket has no cleanup"
    );
    assert_invalid(
        store.cleanup_step(&claim, 10, Duration::ZERO).await,
        "cleanup before publish",
    );
    assert_eq!(all_rows(&store, &b).await.len(), 1, "nothing deleted");
    store.publish_archive(&claim, "m1").await.unwrap();
    assert_invalid(store.publish_archive(&claim, "m1").await, "publish twice");
    assert_invalid(
        store.publish_archive(&claim, "m2").await,
        "publish another key",
    );
    assert_invalid(
        store.snapshot_page(&claim, None, 10).await,
        "snapshot after publish",
    );
    assert_invalid(
        store.defer_archive(&claim, LONG).await,
        "defer after publish",
    );
    let meta = store.bucket(&b).await.unwrap().unwrap();
    assert_eq!(
        meta.state,
        BucketState::Archived {
            object_key: "m1".into(),
            hot_deleted: false
        }
    );

    let cleaner = store.claim_cleanup(&b, LONG).await.unwrap().unwrap();
    assert_invalid(
        store
            .cleanup_step(&cleaner, 10, Duration::from_secs(3600))
            .await,
        "cleanup before min_age",
    );
    assert_invalid(
        store.publish_archive(&cleaner, "m3").await,
        "publish with a cleanup claim",
    );
    let meta = store.bucket(&b).await.unwrap().unwrap();
    assert_eq!(
        meta.state,
        BucketState::Archived {
            object_key: "m1".into(),
            hot_deleted: false
        }
    );
    assert_eq!(
        store
            .cleanup_step(&cleaner, 10, Duration::ZERO)
            .await
            .unwrap(),
        (1, true)
    );
    // Unknown buckets: claims find nothing, steps are stale.
    let ghost = BucketId {
        partition_key: pk("ghost"),
        ..b.clone()
    };
    assert!(store.claim(&ghost, LONG).await.unwrap().is_none());
    assert_stale(
        store
            .publish_archive(
                &Claim {
                    bucket: ghost,
                    ..claim
                },
                "x",
            )
            .await,
        "publish on a missing bucket",
    );
}

/// A cleanup claim's lease expires like any other: its steps are refused, and another
/// cleanup claim (generation + 1) takes over.
pub async fn cleanup_lease_expires(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let tbl = table(&store, "events", s).await;
    let r = rec("p", t("2021-06-01T00:00:00Z"), b"1", b"v");
    store.append(&tbl, &r).await.unwrap();
    let b = bucket_of(&tbl, s, &r);
    let claim = store.claim(&b, LONG).await.unwrap().unwrap();
    store.publish_archive(&claim, "m").await.unwrap();
    let c1 = store.claim_cleanup(&b, SHORT).await.unwrap().unwrap();
    tokio::time::sleep(PAST_SHORT).await;
    assert_stale(
        store.cleanup_step(&c1, 10, Duration::ZERO).await,
        "cleanup after expiry",
    );
    assert_stale(store.renew(&c1, LONG).await, "renew cleanup after expiry");
    let c2 = store.claim_cleanup(&b, LONG).await.unwrap().unwrap();
    assert_eq!(c2.generation, c1.generation + 1);
    assert_eq!(
        store.cleanup_step(&c2, 10, Duration::ZERO).await.unwrap(),
        (1, true)
    );
}

/// Renewal extends the lease past its original expiry.
pub async fn renew_extends_the_lease(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let tbl = table(&store, "events", s).await;
    let r = rec("p", t("2021-06-01T00:00:00Z"), b"1", b"v");
    store.append(&tbl, &r).await.unwrap();
    let b = bucket_of(&tbl, s, &r);
    let claim = store.claim(&b, SHORT).await.unwrap().unwrap();
    let renewed = store.renew(&claim, LONG).await.unwrap();
    assert!(renewed.expires_at > claim.expires_at);
    assert_eq!(
        (renewed.generation, &renewed.token),
        (claim.generation, &claim.token)
    );
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(
        store.snapshot_page(&renewed, None, 10).await.unwrap(),
        vec![r]
    );
    // The claim value is not the lease: the old copy keeps working after renewal.
    store.publish_archive(&claim, "m").await.unwrap();
}

// ---------------------------------------------------------------------------------------
// concurrency

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

/// Claimers racing for one bucket: exactly one wins each generation.
pub async fn racing_claimers(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let tbl = table(&store, "events", s).await;
    let r = rec("p", t("2021-06-01T00:00:00Z"), b"1", b"v");
    store.append(&tbl, &r).await.unwrap();
    let b = bucket_of(&tbl, s, &r);
    let mut tokens = BTreeSet::new();
    for generation in 1..=6i64 {
        let barrier = Arc::new(tokio::sync::Barrier::new(6));
        let mut tasks = Vec::new();
        for _ in 0..6 {
            let (store, b, barrier) = (store.clone(), b.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                store.claim(&b, Duration::from_millis(250)).await.unwrap()
            }));
        }
        let mut winners = Vec::new();
        for task in tasks {
            if let Some(c) = task.await.unwrap() {
                winners.push(c);
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "generation {generation}: exactly one winner"
        );
        assert_eq!(winners[0].generation, generation);
        assert!(tokens.insert(winners[0].token.clone()), "tokens are fresh");
        assert_eq!(
            store.bucket(&b).await.unwrap().unwrap().generation,
            generation
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
}

// ---------------------------------------------------------------------------------------
// reads

/// `read_page` agrees with `ScanBounds::matches` on every combination of time bounds,
/// sort-key bounds, cursors, direction and limit; keyset paging visits every row once.
pub async fn read_page_matches_reference(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let tbl = table(&store, "events", s).await;
    let base = t("2021-06-01T00:00:00Z").as_micros();
    let sort_keys: Vec<Vec<u8>> = vec![
        vec![],
        vec![0],
        vec![0, 0],
        vec![1],
        vec![1, 2],
        vec![0x7f],
        vec![0x80],
        vec![0xff],
    ];
    let mut data = Vec::new();
    for i in 0..6i64 {
        for (j, k) in sort_keys.iter().enumerate() {
            if (i + j as i64) % 3 == 2 {
                continue;
            }
            let time = EventTime::from_micros(base + i * 1_000_000).unwrap();
            data.push(rec("p", time, k, format!("v{i}-{j}").as_bytes()));
        }
    }
    store.append_batch(&tbl, &data).await.unwrap();
    // A record in a neighbouring bucket and another partition must never appear.
    store
        .append(&tbl, &rec("p", t("2021-06-02T00:00:00Z"), b"", b"next day"))
        .await
        .unwrap();
    store
        .append(
            &tbl,
            &rec("q", t("2021-06-01T00:00:01Z"), b"", b"other partition"),
        )
        .await
        .unwrap();
    let b = bucket_of(&tbl, s, &data[0]);
    let mut sorted = data.clone();
    sorted.sort_by_key(|r| r.clustering_key());

    let times: Vec<EventTime> = (-1..=6)
        .map(|i| EventTime::from_micros(base + i * 1_000_000).unwrap())
        .collect();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    for case in 0..150 {
        let pick_time = |next: &mut dyn FnMut(usize) -> usize| match next(3) {
            0 => Bound::Unbounded,
            1 => Bound::Included(times[next(times.len())]),
            _ => Bound::Excluded(times[next(times.len())]),
        };
        let time_lower = pick_time(&mut next);
        let time_upper = pick_time(&mut next);
        let pick_sort = |next: &mut dyn FnMut(usize) -> usize| match next(4) {
            0 | 3 => Bound::Unbounded,
            1 => Bound::Included(SortKey::new(sort_keys[next(sort_keys.len())].clone()).unwrap()),
            _ => Bound::Excluded(SortKey::new(sort_keys[next(sort_keys.len())].clone()).unwrap()),
        };
        let sort_lower = pick_sort(&mut next);
        let sort_upper = pick_sort(&mut next);
        let cursor = |next: &mut dyn FnMut(usize) -> usize| {
            (next(3) == 0).then(|| ClusteringKey {
                event_time: times[next(times.len())],
                sort_key: SortKey::new(sort_keys[next(sort_keys.len())].clone()).unwrap(),
            })
        };
        let after = cursor(&mut next);
        let before = cursor(&mut next);
        let bounds = ScanBounds {
            time_lower,
            time_upper,
            sort_lower,
            sort_upper,
            after,
            before,
        };
        let descending = next(2) == 1;
        let limit = [1, 3, 7, 1000][next(4)];
        let include_value = next(4) != 0;
        let mut expected: Vec<Record> = sorted
            .iter()
            .filter(|r| bounds.matches(r))
            .cloned()
            .collect();
        if descending {
            expected.reverse();
        }
        expected.truncate(limit);
        if !include_value {
            for r in &mut expected {
                r.value.clear();
            }
        }
        let req = PageRequest {
            bounds: bounds.clone(),
            descending,
            limit,
            include_value,
        };
        match store.read_page(&b, &req).await.unwrap() {
            HotPage::Hot { state, rows } => {
                assert_eq!(state, BucketState::Hot);
                assert_eq!(
                    rows,
                    records_to_batch(&expected, include_value),
                    "case {case}: {req:?}"
                );
            }
            x => panic!("case {case}: expected a hot page, got {x:?}"),
        }
    }

    // Keyset paging, both directions, reproduces the bucket exactly once.
    for descending in [false, true] {
        let mut seen = Vec::new();
        let mut bounds = ScanBounds::all();
        loop {
            let req = PageRequest {
                bounds: bounds.clone(),
                descending,
                limit: 5,
                include_value: true,
            };
            let HotPage::Hot { rows, .. } = store.read_page(&b, &req).await.unwrap() else {
                panic!("hot")
            };
            let rows = batch_to_records(&rows).unwrap();
            let Some(last) = rows.last() else { break };
            bounds = if descending {
                bounds.with_before(last.clustering_key())
            } else {
                bounds.with_after(last.clustering_key())
            };
            seen.extend(rows);
        }
        let mut want = sorted.clone();
        if descending {
            want.reverse();
        }
        assert_eq!(seen, want, "paging descending={descending}");
    }
}

/// A bucket without metadata is Missing; a Hot bucket with no matching rows is an empty page.
pub async fn read_page_missing_and_empty(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let tbl = table(&store, "events", s).await;
    let r = rec("p", t("2021-06-01T00:00:00Z"), b"1", b"v");
    let b = bucket_of(&tbl, s, &r);
    let req = PageRequest {
        bounds: ScanBounds::all(),
        descending: false,
        limit: 10,
        include_value: true,
    };
    assert_eq!(store.read_page(&b, &req).await.unwrap(), HotPage::Missing);
    store.append(&tbl, &r).await.unwrap();
    let none = PageRequest {
        bounds: ScanBounds {
            time_lower: Bound::Excluded(r.event_time),
            ..ScanBounds::all()
        },
        ..req.clone()
    };
    assert_eq!(
        store.read_page(&b, &none).await.unwrap(),
        HotPage::hot(BucketState::Hot, &[], true)
    );
    // An archiving bucket that was emptied by nothing still routes to hot rows.
    let claim = store.claim(&b, LONG).await.unwrap().unwrap();
    assert_eq!(
        store.read_page(&b, &none).await.unwrap(),
        HotPage::hot(BucketState::Archiving, &[], true)
    );
    assert!(store
        .snapshot_page(&claim, Some(&r.clustering_key()), 10)
        .await
        .unwrap()
        .is_empty());
}

/// `list_buckets` as `read_head` lists: each bucket's identity and route.
async fn routed(store: &Store, tbl: &TableId, filter: &BucketFilter) -> Vec<RoutedBucket> {
    let listed = store.list_buckets(tbl, filter).await.unwrap();
    listed.into_iter().map(RoutedBucket::from).collect()
}

/// `read_head` returns what `list_buckets` for the partition and `read_page` of the first
/// bucket in scan order return, over hot, archiving and archived first buckets, both
/// directions, open and closed intervals, cursors and limits.
pub async fn read_head_matches_listing_and_page(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let tbl = table(&store, "events", s).await;
    let mut recs = Vec::new();
    for day in 1..=4 {
        for i in 0..4u8 {
            let time = t(&format!("2021-06-0{day}T0{i}:00:00Z"));
            recs.push(rec("p", time, &[i], format!("d{day}-{i}").as_bytes()));
        }
    }
    recs.push(rec(
        "q",
        t("2021-06-02T05:00:00Z"),
        b"q",
        b"other partition",
    ));
    store.append_batch(&tbl, &recs).await.unwrap();
    // Day 2 Archiving, day 3 Archived (hot rows kept), days 1 and 4 Hot.
    let day = |d: u32| {
        bucket_of(
            &tbl,
            s,
            &rec("p", t(&format!("2021-06-0{d}T00:00:00Z")), b"", b""),
        )
    };
    store.claim(&day(2), LONG).await.unwrap().unwrap();
    let c3 = store.claim(&day(3), LONG).await.unwrap().unwrap();
    store
        .publish_archive(&c3, "objects/day3/manifest.json")
        .await
        .unwrap();

    let times = [
        None,
        Some(t("2021-06-01T02:00:00Z")),
        Some(t("2021-06-02T23:59:59Z")),
        Some(t("2021-06-03T01:00:00Z")),
        Some(t("2021-06-04T02:30:00Z")),
        Some(t("2021-06-09T00:00:00Z")),
    ];
    let p = pk("p");
    let mut kinds = BTreeSet::new();
    for from in times {
        for to in times {
            for descending in [false, true] {
                for (limit, cursor) in [(1, false), (3, true), (100, false)] {
                    let mut bounds = ScanBounds::all();
                    if let Some(f) = from {
                        bounds.time_lower = Bound::Included(f);
                    }
                    if let Some(u) = to {
                        bounds.time_upper = Bound::Included(u);
                    }
                    if cursor {
                        let key = ClusteringKey {
                            event_time: t("2021-06-04T01:00:00Z"),
                            sort_key: SortKey::new(vec![1]).unwrap(),
                        };
                        bounds = if descending {
                            bounds.with_before(key)
                        } else {
                            bounds.with_after(key)
                        };
                    }
                    let req = PageRequest {
                        bounds,
                        descending,
                        limit,
                        include_value: limit != 1,
                    };
                    let head = store.read_head(&tbl, &p, from, to, &req).await.unwrap();
                    let filter = BucketFilter {
                        partitions: Some(vec![p.clone()]),
                        from,
                        to,
                        ..Default::default()
                    };
                    let listed = routed(&store, &tbl, &filter).await;
                    let first = if descending {
                        listed.last()
                    } else {
                        listed.first()
                    };
                    assert_eq!(head.bucket.as_ref(), first, "bucket {from:?}..{to:?}");
                    let want = match first {
                        None => HotPage::Missing,
                        Some(m) => store.read_page(&m.id, &req).await.unwrap(),
                    };
                    // The head's rows are the page's records, as one envelope batch.
                    let want = want;
                    assert_eq!(head.first, want, "{from:?}..{to:?} {req:?}");
                    kinds.insert(match &head.first {
                        HotPage::Missing => "missing",
                        HotPage::Archived { .. } => "archived",
                        HotPage::Hot { rows, .. } if rows.num_rows() == 0 => "empty",
                        HotPage::Hot {
                            state: BucketState::Archiving,
                            ..
                        } => "archiving",
                        HotPage::Hot { .. } => "hot",
                    });
                }
            }
        }
    }
    assert_eq!(
        kinds,
        BTreeSet::from(["archived", "archiving", "empty", "hot", "missing"]),
        "the cases cover every kind of first page"
    );
}

/// On a partition with a long history, `read_head` finds the first bucket in scan order of
/// any window (the whole history, windows inside it, one that starts between buckets) and
/// reads that bucket's page.
pub async fn read_head_finds_the_first_bucket_of_a_long_history(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let tbl = table(&store, "events", s).await;
    let days = 10;
    let day0 = t("2021-01-01T12:00:00Z").as_micros();
    let recs: Vec<Record> = (0..days)
        .map(|d| {
            let time = EventTime::from_micros(day0 + d * 86_400_000_000).unwrap();
            rec("p", time, &[d as u8], format!("day {d}").as_bytes())
        })
        .collect();
    store.append_batch(&tbl, &recs).await.unwrap();
    let p = pk("p");
    let at = |d: i64| Some(EventTime::from_micros(day0 + d * 86_400_000_000).unwrap());
    // Day `d`'s message is at noon: a window from 13:00 on day 2 overlaps day 2's bucket
    // (which holds no matching row), and one to 11:00 on day 7 overlaps day 7's.
    let hour = 3_600_000_000;
    let skew = |d: i64, h: i64| {
        Some(EventTime::from_micros(day0 + d * 86_400_000_000 + h * hour).unwrap())
    };
    for (from, to, asc_day, desc_day) in [
        (None, None, 0, days - 1),
        (at(2), at(days - 3), 2, days - 3),
        (at(4), at(4), 4, 4),
        (skew(2, 1), skew(7, -1), 2, 7),
    ] {
        for descending in [false, true] {
            let mut bounds = ScanBounds::all();
            if let Some(f) = from {
                bounds.time_lower = Bound::Included(f);
            }
            if let Some(u) = to {
                bounds.time_upper = Bound::Included(u);
            }
            let req = PageRequest {
                bounds,
                descending,
                limit: 5,
                include_value: true,
            };
            let head = store.read_head(&tbl, &p, from, to, &req).await.unwrap();
            let day = if descending { desc_day } else { asc_day };
            let want = bucket_of(&tbl, s, &recs[day as usize]);
            let bucket = head.bucket.as_ref().expect("a bucket overlaps");
            assert_eq!(bucket.id, want, "{from:?}..{to:?} desc {descending}");
            assert_eq!(bucket.state, BucketState::Hot);
            let page = store.read_page(&want, &req).await.unwrap();
            assert_eq!(head.first, page);
            // The skewed window's edge buckets hold no row inside it.
            let rows = usize::from(from != skew(2, 1));
            assert!(
                matches!(head.first, HotPage::Hot { rows: ref r, .. } if r.num_rows() == rows),
                "{from:?}..{to:?} desc {descending}: {:?}",
                head.first
            );
        }
    }
}

/// Buckets are listed by partition, then start, and filtered by partition and time.
pub async fn list_buckets_filters(store: Store) {
    let s = BucketStrategy::CalendarMonthUtc;
    let tbl = table(&store, "events", s).await;
    let other = table(&store, "other", s).await;
    let recs = [
        rec("b", t("2021-03-05T00:00:00Z"), b"", b""),
        rec("a", t("2021-02-05T00:00:00Z"), b"", b""),
        rec("a", t("2021-01-05T00:00:00Z"), b"", b""),
        rec("b", t("2021-01-05T00:00:00Z"), b"", b""),
    ];
    store.append_batch(&tbl, &recs).await.unwrap();
    store.append(&other, &recs[0]).await.unwrap();
    let names = |v: Vec<pulpitum::store::BucketMeta>| -> Vec<String> {
        v.iter()
            .map(|m| {
                format!(
                    "{}:{}",
                    String::from_utf8_lossy(m.id.partition_key.as_bytes()),
                    m.id.bucket_key
                )
            })
            .collect()
    };
    let all = store
        .list_buckets(&tbl, &BucketFilter::default())
        .await
        .unwrap();
    assert!(all
        .iter()
        .all(|m| m.state == BucketState::Hot && m.id.table_id == tbl));
    assert_eq!(
        names(all),
        [
            "a:month:2021-01",
            "a:month:2021-02",
            "b:month:2021-01",
            "b:month:2021-03"
        ]
    );
    let only_b = BucketFilter {
        partitions: Some(vec![pk("b")]),
        ..Default::default()
    };
    assert_eq!(
        names(store.list_buckets(&tbl, &only_b).await.unwrap()),
        ["b:month:2021-01", "b:month:2021-03"]
    );
    let none = BucketFilter {
        partitions: Some(vec![]),
        ..Default::default()
    };
    assert!(store.list_buckets(&tbl, &none).await.unwrap().is_empty());
    // [from, to] overlaps February only: January ends at Feb 1 (not after from).
    let feb = BucketFilter {
        partitions: None,
        from: Some(t("2021-02-01T00:00:00Z")),
        to: Some(t("2021-02-28T00:00:00Z")),
        ..Default::default()
    };
    assert_eq!(
        names(store.list_buckets(&tbl, &feb).await.unwrap()),
        ["a:month:2021-02"]
    );
    let to_march_start = BucketFilter {
        partitions: None,
        from: Some(t("2021-02-15T00:00:00Z")),
        to: Some(t("2021-03-01T00:00:00Z")),
        ..Default::default()
    };
    assert_eq!(
        names(store.list_buckets(&tbl, &to_march_start).await.unwrap()),
        ["a:month:2021-02", "b:month:2021-03"]
    );
    // Newest first within each partition, partitions still in key order; a limit keeps the
    // first buckets of that order, across partitions.
    let listed = |descending, limit, partitions: Option<Vec<PartitionKey>>| {
        let filter = BucketFilter {
            partitions,
            descending,
            limit,
            ..Default::default()
        };
        let store = store.clone();
        let tbl = tbl.clone();
        async move { names(store.list_buckets(&tbl, &filter).await.unwrap()) }
    };
    assert_eq!(
        listed(true, None, None).await,
        [
            "a:month:2021-02",
            "a:month:2021-01",
            "b:month:2021-03",
            "b:month:2021-01"
        ]
    );
    assert_eq!(
        listed(false, Some(3), None).await,
        ["a:month:2021-01", "a:month:2021-02", "b:month:2021-01"]
    );
    assert_eq!(
        listed(true, Some(3), None).await,
        ["a:month:2021-02", "a:month:2021-01", "b:month:2021-03"]
    );
    assert_eq!(
        listed(true, Some(3), Some(vec![pk("b"), pk("a")])).await,
        ["a:month:2021-02", "a:month:2021-01", "b:month:2021-03"]
    );
    assert_eq!(
        listed(true, Some(1), Some(vec![pk("b")])).await,
        ["b:month:2021-03"]
    );
    assert_eq!(listed(false, Some(9), None).await.len(), 4);
    assert!(listed(false, Some(0), None).await.is_empty());
}

/// Discovery: eligible Hot buckets ended by the cutoff, expired claims and pending
/// cleanups, oldest bucket first, bounded by the limit.
pub async fn discover_orders_and_limits(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let tbl = table(&store, "events", s).await;
    let days = [
        "2021-06-05",
        "2021-06-01",
        "2021-06-03",
        "2021-06-02",
        "2021-06-04",
        "2021-06-09",
    ];
    for d in days {
        store
            .append(&tbl, &rec("p", t(&format!("{d}T12:00:00Z")), b"", b""))
            .await
            .unwrap();
    }
    let id = |d: &str| BucketId {
        table_id: tbl.clone(),
        partition_key: pk("p"),
        bucket_key: BucketKey::parse(s, &format!("day:{d}")).unwrap(),
    };
    // 06-02: expired claim; 06-03: live claim (not work); 06-04: published, cleanup pending.
    store
        .claim(&id("2021-06-02"), Duration::from_millis(1))
        .await
        .unwrap()
        .unwrap();
    store.claim(&id("2021-06-03"), LONG).await.unwrap().unwrap();
    let c = store.claim(&id("2021-06-04"), LONG).await.unwrap().unwrap();
    store.publish_archive(&c, "m4").await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let cutoff = t("2021-06-06T00:00:00Z");
    let work = store.discover(cutoff, 100).await.unwrap();
    let got: Vec<(String, WorkKind)> = work
        .iter()
        .map(|w| (w.bucket.bucket_key.to_string(), w.kind))
        .collect();
    assert_eq!(
        got,
        vec![
            ("day:2021-06-01".into(), WorkKind::Eligible),
            ("day:2021-06-02".into(), WorkKind::ExpiredClaim),
            ("day:2021-06-04".into(), WorkKind::CleanupPending),
            ("day:2021-06-05".into(), WorkKind::Eligible),
        ]
    );
    let first_two = store.discover(cutoff, 2).await.unwrap();
    assert_eq!(first_two, work[..2].to_vec());
    assert!(store.discover(cutoff, 0).await.unwrap().is_empty());
}

/// The backlog counts Hot buckets ended by the cutoff (a deferred one included) and
/// claimed, unpublished ones; published buckets and buckets after the cutoff are not counted.
pub async fn backlog_counts_eligible_and_archiving(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let cutoff = t("2021-06-06T00:00:00Z");
    let tbl = table(&store, "events", s).await;
    assert_eq!(store.backlog(cutoff).await.unwrap(), Backlog::default());
    for d in ["01", "02", "03", "04", "05", "09"] {
        store
            .append(
                &tbl,
                &rec("p", t(&format!("2021-06-{d}T12:00:00Z")), b"", b""),
            )
            .await
            .unwrap();
    }
    let id = |d: &str| BucketId {
        table_id: tbl.clone(),
        partition_key: pk("p"),
        bucket_key: BucketKey::parse(s, &format!("day:2021-06-{d}")).unwrap(),
    };
    let counts = |eligible, archiving| Backlog {
        eligible,
        archiving,
    };
    // Five days end by the cutoff; 06-09 does not.
    assert_eq!(store.backlog(cutoff).await.unwrap(), counts(5, 0));
    // 06-01 claimed (in flight), 06-02 claimed then deferred (still eligible), 06-03
    // published, 06-04 claimed with a lease that has expired (still in flight).
    store.claim(&id("01"), LONG).await.unwrap().unwrap();
    let c = store.claim(&id("02"), LONG).await.unwrap().unwrap();
    store.defer_archive(&c, LONG).await.unwrap();
    let c = store.claim(&id("03"), LONG).await.unwrap().unwrap();
    store.publish_archive(&c, "m3").await.unwrap();
    store
        .claim(&id("04"), Duration::from_millis(1))
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(store.backlog(cutoff).await.unwrap(), counts(2, 2));
    // The cutoff bounds only the eligible count.
    assert_eq!(
        store.backlog(t("2030-01-01T00:00:00Z")).await.unwrap(),
        counts(3, 2)
    );
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
