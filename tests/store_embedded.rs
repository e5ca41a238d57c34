//! The hot-store conformance suite (`tests/conformance/`, shared with the PostgreSQL store)
//! run against [`SqliteStore`], followed by the embedded store's own tests: every state
//! transition and rejection, the fence under concurrent writers, racing claimers (in one
//! process and across connections to one file), concurrent migrations, the runtime never
//! blocked by a waiting call, and bad input. Each test uses a fresh SQLite file in its own
//! temporary directory, so tests run in parallel.

#[macro_use]
mod conformance;

/// The shared suite, one test per case, each on a fresh file-backed store.
mod suite {
    use std::sync::Arc;

    use pulpitum::store::embedded::SqliteStore;

    use super::conformance;

    macro_rules! conformance_cases {
        ($($case:ident),* $(,)?) => {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let dir = tempfile::tempdir().unwrap();
                    let store = SqliteStore::open(dir.path().join("hot.sqlite")).unwrap();
                    conformance::$case(Arc::new(store)).await;
                }
            )*
        };
    }

    every_case!(conformance_cases);
}

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pulpitum::model::{
    BucketId, BucketKey, BucketStrategy, ClusteringKey, EventTime, ModelError, PartitionKey,
    Record, ScanBounds, SortKey, TableId,
};
use pulpitum::store::embedded::SqliteStore;
use pulpitum::store::{
    AppendOutcome, Appends, BucketFilter, BucketState, Catalog, Claim, Eligibility, HotPage,
    Lifecycle, PageRequest, RoutedReads, StoreError, TableDefinition, WorkItem, WorkKind,
};
use tempfile::TempDir;

const DAY: i64 = 86_400_000_000;
const LONG: Duration = Duration::from_secs(60);

fn tid(s: &str) -> TableId {
    TableId::new(s).unwrap()
}

fn t0() -> i64 {
    EventTime::parse_rfc3339("2024-03-10T00:00:00Z")
        .unwrap()
        .as_micros()
}

fn rec(pk: &[u8], micros: i64, sk: &[u8], v: &[u8]) -> Record {
    Record {
        partition_key: PartitionKey::new(pk.to_vec()).unwrap(),
        event_time: EventTime::from_micros(micros).unwrap(),
        sort_key: SortKey::new(sk.to_vec()).unwrap(),
        value: v.to_vec(),
    }
}

fn def() -> TableDefinition {
    TableDefinition::new(tid("t"), BucketStrategy::CalendarDayUtc, "raw")
}

fn bucket_of(r: &Record) -> BucketId {
    BucketId::of_record(&tid("t"), BucketStrategy::CalendarDayUtc, r)
}

async fn fresh() -> (TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path().join("hot.sqlite")).unwrap();
    s.migrate().await.unwrap();
    s.register_table(&def()).await.unwrap();
    (dir, s)
}

/// A bucket on day `d` after `t0` holding `n` records; returns the bucket and its records in
/// clustering order.
async fn filled(s: &SqliteStore, pk: &[u8], d: i64, n: usize) -> (BucketId, Vec<Record>) {
    let rows: Vec<Record> = (0..n)
        .map(|i| {
            rec(
                pk,
                t0() + d * DAY + (i as i64 / 2) * 1_000,
                &[i as u8],
                format!("v{i}").as_bytes(),
            )
        })
        .collect();
    let out = s.append_batch(&tid("t"), &rows).await.unwrap();
    assert_eq!(out.inserted, n as u64);
    (bucket_of(&rows[0]), rows)
}

async fn snapshot_all(s: &SqliteStore, c: &Claim, page: usize) -> Vec<Record> {
    let mut out: Vec<Record> = Vec::new();
    loop {
        let after = out.last().map(Record::clustering_key);
        let rows = s.snapshot_page(c, after.as_ref(), page).await.unwrap();
        assert!(rows.len() <= page);
        if rows.is_empty() {
            return out;
        }
        out.extend(rows);
    }
}

fn all_rows(limit: usize) -> PageRequest {
    PageRequest {
        bounds: ScanBounds::all(),
        descending: false,
        limit,
        include_value: true,
    }
}

fn assert_stale(r: Result<impl std::fmt::Debug, StoreError>, needle: &str) {
    match r {
        Err(StoreError::StaleClaim { reason, .. }) => {
            assert!(
                reason.contains(needle),
                "reason {reason:?} should mention {needle:?}"
            )
        }
        other => panic!("expected StaleClaim ({needle}), got {other:?}"),
    }
}

fn assert_invalid(r: Result<impl std::fmt::Debug, StoreError>, op: &str) {
    match r {
        Err(StoreError::InvalidTransition { operation, .. }) => {
            assert!(
                operation.contains(op),
                "operation {operation:?} should be {op:?}"
            )
        }
        other => panic!("expected InvalidTransition ({op}), got {other:?}"),
    }
}

#[tokio::test]
async fn full_lifecycle_claim_snapshot_publish_cleanup() {
    let (_d, s) = fresh().await;
    let (id, rows) = filled(&s, b"chan", 0, 7).await;
    let now = s.now().await.unwrap();

    assert_eq!(
        s.discover(&Eligibility::before(now), 10).await.unwrap(),
        vec![WorkItem {
            bucket: id.clone(),
            kind: WorkKind::Eligible
        }]
    );
    let c = s
        .claim(&id, LONG)
        .await
        .unwrap()
        .expect("hot bucket is claimable");
    assert_eq!(c.generation, 1);
    assert!(c.expires_at > now);
    let meta = s.bucket(&id).await.unwrap().unwrap();
    assert_eq!(meta.state, BucketState::Archiving);
    assert_eq!(meta.owner_token.as_deref(), Some(c.token.as_str()));
    assert_eq!(meta.lease_expires_at, Some(c.expires_at));
    assert_eq!(meta.generation, 1);
    assert!(
        s.discover(&Eligibility::before(now), 10)
            .await
            .unwrap()
            .is_empty(),
        "a live claim is not work"
    );
    assert!(
        s.claim(&id, LONG).await.unwrap().is_none(),
        "a live claim cannot be taken"
    );

    // The fence: nothing new commits, not even an identical retry of an existing record.
    let late = rec(b"chan", t0() + 500, b"late", b"x");
    match s.append(&tid("t"), &late).await {
        Err(StoreError::Fenced { state, bucket }) => {
            assert_eq!(state, "archiving");
            assert_eq!(bucket, id);
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert!(matches!(
        s.append(&tid("t"), &rows[0]).await,
        Err(StoreError::Fenced { .. })
    ));

    // Archiving is still read from the hot tier.
    let page = s.read_page(&id, &all_rows(100)).await.unwrap();
    assert_eq!(page, HotPage::hot(BucketState::Archiving, &rows, true));
    assert_eq!(snapshot_all(&s, &c, 3).await, rows);

    let renewed = s.renew(&c, Duration::from_secs(120)).await.unwrap();
    assert!(renewed.expires_at > c.expires_at);
    assert_eq!(
        (renewed.token.as_str(), renewed.generation),
        (c.token.as_str(), 1)
    );

    s.publish_archive(&renewed, "t/manifest-g1.json")
        .await
        .unwrap();
    let meta = s.bucket(&id).await.unwrap().unwrap();
    assert_eq!(
        meta.state,
        BucketState::Archived {
            object_key: "t/manifest-g1.json".into(),
            hot_deleted: false
        }
    );
    assert!(meta.published_at.is_some());
    assert_eq!(meta.owner_token, None, "publication ends the claim");
    assert_eq!(
        s.read_page(&id, &all_rows(100)).await.unwrap(),
        HotPage::Archived {
            object_key: "t/manifest-g1.json".into()
        }
    );
    assert!(matches!(
        s.append(&tid("t"), &late).await,
        Err(StoreError::Fenced {
            state: "archived",
            ..
        })
    ));
    assert_eq!(
        s.referenced_object_keys().await.unwrap(),
        vec!["t/manifest-g1.json".to_string()]
    );
    assert_eq!(
        s.discover(&Eligibility::before(now), 10).await.unwrap(),
        vec![WorkItem {
            bucket: id.clone(),
            kind: WorkKind::CleanupPending
        }]
    );
    assert!(s.claim(&id, LONG).await.unwrap().is_none());

    let cc = s
        .claim_cleanup(&id, LONG)
        .await
        .unwrap()
        .expect("cleanup is claimable");
    assert_eq!(cc.generation, 2);
    assert!(
        s.claim_cleanup(&id, LONG).await.unwrap().is_none(),
        "held by cc"
    );
    assert!(s
        .discover(&Eligibility::before(now), 10)
        .await
        .unwrap()
        .is_empty());
    let mut deleted = 0;
    let mut steps = 0;
    loop {
        let (n, done) = s.cleanup_step(&cc, 3, Duration::ZERO).await.unwrap();
        deleted += n;
        steps += 1;
        assert!(n <= 3);
        if done {
            break;
        }
    }
    assert_eq!(deleted, 7);
    assert!(steps >= 3, "chunked deletes");
    let meta = s.bucket(&id).await.unwrap().unwrap();
    assert_eq!(
        meta.state,
        BucketState::Archived {
            object_key: "t/manifest-g1.json".into(),
            hot_deleted: true
        }
    );
    assert_eq!(
        s.cleanup_step(&cc, 3, Duration::ZERO).await.unwrap(),
        (0, true),
        "idempotent"
    );
    assert!(s.claim_cleanup(&id, LONG).await.unwrap().is_none());
    assert!(s
        .discover(&Eligibility::before(now), 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        s.read_page(&id, &all_rows(100)).await.unwrap(),
        HotPage::Archived {
            object_key: "t/manifest-g1.json".into()
        }
    );
}

#[tokio::test]
async fn stale_tokens_and_generations_are_rejected_and_write_nothing() {
    let (_d, s) = fresh().await;
    let (id, _) = filled(&s, b"p", 0, 3).await;
    let c = s.claim(&id, LONG).await.unwrap().unwrap();
    let before = s.bucket(&id).await.unwrap();

    let wrong_token = Claim {
        token: "0".repeat(32),
        ..c.clone()
    };
    assert_stale(
        s.snapshot_page(&wrong_token, None, 10).await,
        "another owner token",
    );
    assert_stale(
        s.publish_archive(&wrong_token, "k").await,
        "another owner token",
    );
    assert_stale(s.renew(&wrong_token, LONG).await, "another owner token");
    assert_stale(
        s.defer_archive(&wrong_token, LONG).await,
        "another owner token",
    );

    for generation in [0, 2] {
        let wrong_gen = Claim {
            generation,
            ..c.clone()
        };
        assert_stale(s.snapshot_page(&wrong_gen, None, 10).await, "generation 1");
        assert_stale(s.publish_archive(&wrong_gen, "k").await, "generation 1");
        assert_stale(s.renew(&wrong_gen, LONG).await, "generation 1");
        assert_stale(s.defer_archive(&wrong_gen, LONG).await, "generation 1");
    }
    let other_bucket = Claim {
        bucket: bucket_of(&rec(b"p", t0() + 9 * DAY, b"", b"")),
        ..c.clone()
    };
    assert_stale(s.publish_archive(&other_bucket, "k").await, "no metadata");
    assert_eq!(
        s.bucket(&id).await.unwrap(),
        before,
        "rejections write nothing"
    );
    assert!(s.referenced_object_keys().await.unwrap().is_empty());
}

#[tokio::test]
async fn an_expired_lease_loses_ownership_to_the_next_claim() {
    let (_d, s) = fresh().await;
    let (id, rows) = filled(&s, b"p", 0, 4).await;
    let c1 = s
        .claim(&id, Duration::from_millis(150))
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;

    assert_stale(s.snapshot_page(&c1, None, 10).await, "expired");
    assert_stale(s.publish_archive(&c1, "k1").await, "expired");
    assert_stale(s.renew(&c1, LONG).await, "expired");
    assert_stale(s.defer_archive(&c1, LONG).await, "expired");
    // Still fenced while nobody holds it: an expired claim does not reopen writes.
    assert!(matches!(
        s.append(&tid("t"), &rec(b"p", t0() + 1, b"z", b"")).await,
        Err(StoreError::Fenced { .. })
    ));
    let now = s.now().await.unwrap();
    assert_eq!(
        s.discover(&Eligibility::before(now), 10).await.unwrap(),
        vec![WorkItem {
            bucket: id.clone(),
            kind: WorkKind::ExpiredClaim
        }]
    );

    let c2 = s
        .claim(&id, LONG)
        .await
        .unwrap()
        .expect("expired claim is reclaimable");
    assert_eq!(c2.generation, 2);
    assert_ne!(c2.token, c1.token);
    assert_stale(s.publish_archive(&c1, "k1").await, "generation 2");
    assert_eq!(snapshot_all(&s, &c2, 10).await, rows);
    s.publish_archive(&c2, "k2").await.unwrap();
    assert_eq!(
        s.referenced_object_keys().await.unwrap(),
        vec!["k2".to_string()]
    );
}

#[tokio::test]
async fn defer_returns_the_bucket_to_hot_until_the_retry_time() {
    let (_d, s) = fresh().await;
    let (id, _) = filled(&s, b"p", 0, 2).await;
    let c = s.claim(&id, LONG).await.unwrap().unwrap();
    s.defer_archive(&c, Duration::from_millis(300))
        .await
        .unwrap();
    let meta = s.bucket(&id).await.unwrap().unwrap();
    assert_eq!(meta.state, BucketState::Hot);
    assert_eq!(meta.generation, 1, "defer keeps the generation");
    assert_eq!(meta.owner_token, None);
    assert!(meta.retry_at.is_some());

    // Hot again: appends commit.
    let extra = rec(b"p", t0() + 77, b"new", b"x");
    assert_eq!(
        s.append(&tid("t"), &extra).await.unwrap(),
        AppendOutcome::Inserted
    );
    // The deferring claim is over.
    assert_invalid(s.snapshot_page(&c, None, 10).await, "snapshot");
    assert_invalid(s.publish_archive(&c, "k").await, "publish");
    assert_invalid(s.defer_archive(&c, LONG).await, "defer");
    assert_stale(s.renew(&c, LONG).await, "released");

    let now = s.now().await.unwrap();
    assert!(
        s.claim(&id, LONG).await.unwrap().is_none(),
        "retry time not reached"
    );
    assert!(s
        .discover(&Eligibility::before(now), 10)
        .await
        .unwrap()
        .is_empty());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let now = s.now().await.unwrap();
    assert_eq!(
        s.discover(&Eligibility::before(now), 10)
            .await
            .unwrap()
            .len(),
        1
    );
    let c2 = s
        .claim(&id, LONG)
        .await
        .unwrap()
        .expect("retry time passed");
    assert_eq!(c2.generation, 2);
    assert_eq!(s.bucket(&id).await.unwrap().unwrap().retry_at, None);
    assert_eq!(snapshot_all(&s, &c2, 2).await.len(), 3);
}

#[tokio::test]
async fn wrong_state_transitions_are_refused() {
    let (_d, s) = fresh().await;
    let (id, _) = filled(&s, b"p", 0, 5).await;
    let c = s.claim(&id, LONG).await.unwrap().unwrap();
    // Cleanup before publication: no cleanup claim exists, and the archiving claim cannot clean.
    assert!(s.claim_cleanup(&id, LONG).await.unwrap().is_none());
    assert_invalid(s.cleanup_step(&c, 10, Duration::ZERO).await, "clean up");

    s.publish_archive(&c, "k").await.unwrap();
    // Publish twice.
    assert_invalid(s.publish_archive(&c, "k").await, "publish");
    assert_invalid(s.publish_archive(&c, "other").await, "publish");
    assert_invalid(s.snapshot_page(&c, None, 10).await, "snapshot");
    assert_invalid(s.defer_archive(&c, LONG).await, "defer");
    assert_stale(s.renew(&c, LONG).await, "no owner");
    assert_stale(s.cleanup_step(&c, 10, Duration::ZERO).await, "no owner");

    // Cleanup before min_age since publication.
    let cc = s.claim_cleanup(&id, LONG).await.unwrap().unwrap();
    assert_invalid(
        s.cleanup_step(&cc, 10, Duration::from_secs(3600)).await,
        "min_age",
    );
    let page = s.bucket(&id).await.unwrap().unwrap();
    assert_eq!(
        page.state,
        BucketState::Archived {
            object_key: "k".into(),
            hot_deleted: false
        }
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(
        s.cleanup_step(&cc, 10, Duration::from_millis(200))
            .await
            .unwrap(),
        (5, true)
    );
    // A publication claim of an older generation is stale for everything now.
    assert_stale(s.publish_archive(&c, "k").await, "generation 2");
    assert_eq!(
        s.referenced_object_keys().await.unwrap(),
        vec!["k".to_string()]
    );
}

#[tokio::test]
async fn cleanup_claims_are_leased_and_fenced_by_generation() {
    let (_d, s) = fresh().await;
    let (id, _) = filled(&s, b"p", 0, 6).await;
    let c = s.claim(&id, LONG).await.unwrap().unwrap();
    s.publish_archive(&c, "k").await.unwrap();
    let a = s
        .claim_cleanup(&id, Duration::from_millis(150))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.generation, 2);
    assert_eq!(
        s.cleanup_step(&a, 2, Duration::ZERO).await.unwrap(),
        (2, false)
    );
    let renewed = s.renew(&a, Duration::from_millis(150)).await.unwrap();
    assert!(renewed.expires_at >= a.expires_at);
    assert!(s.claim_cleanup(&id, LONG).await.unwrap().is_none());
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_stale(s.cleanup_step(&a, 2, Duration::ZERO).await, "expired");
    let now = s.now().await.unwrap();
    assert_eq!(
        s.discover(&Eligibility::before(now), 10).await.unwrap(),
        vec![WorkItem {
            bucket: id.clone(),
            kind: WorkKind::CleanupPending
        }]
    );
    let b = s.claim_cleanup(&id, LONG).await.unwrap().unwrap();
    assert_eq!(b.generation, 3);
    assert_stale(s.cleanup_step(&a, 2, Duration::ZERO).await, "generation 3");
    assert_eq!(
        s.cleanup_step(&b, 100, Duration::ZERO).await.unwrap(),
        (4, true)
    );
}

/// The fence under concurrency: 8 writers append continuously while a claim fences the
/// bucket and the claimant snapshots it. Every acknowledged append is in the snapshot, every
/// rejected one is absent, and the counts match exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fence_holds_under_concurrent_writers() {
    let (_d, s) = fresh().await;
    let s = Arc::new(s);
    for round in 0..20u8 {
        let pk = vec![b'r', round];
        let base = t0() + i64::from(round) * DAY;
        let stop = Arc::new(AtomicBool::new(false));
        let mut writers = Vec::new();
        for w in 0..8u8 {
            let (s, stop, pk) = (Arc::clone(&s), Arc::clone(&stop), pk.clone());
            writers.push(tokio::spawn(async move {
                let (mut acked, mut rejected) = (Vec::new(), Vec::new());
                let mut seq: u32 = 0;
                while !stop.load(Ordering::Relaxed) {
                    seq += 1;
                    let mut sk = vec![w];
                    sk.extend_from_slice(&seq.to_be_bytes());
                    let r = rec(&pk, base + i64::from(seq), &sk, &[w]);
                    match s.append(&tid("t"), &r).await {
                        Ok(AppendOutcome::Inserted) => acked.push(r.clustering_key()),
                        Err(StoreError::Fenced { .. }) => rejected.push(r.clustering_key()),
                        other => panic!("unexpected append result {other:?}"),
                    }
                }
                (acked, rejected)
            }));
        }
        // Let the writers create the bucket and get going, then fence it.
        let id = bucket_of(&rec(&pk, base, b"", b""));
        let claim = loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            if s.bucket(&id).await.unwrap().is_some() {
                break s.claim(&id, LONG).await.unwrap().expect("claimable");
            }
        };
        // Snapshot while the writers keep trying, and let them run on afterwards: a write
        // that slipped past the fence would be acknowledged but missing from the snapshot.
        let snap = snapshot_all(&s, &claim, 64).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
        stop.store(true, Ordering::Relaxed);
        let (mut acked, mut rejected) = (BTreeSet::new(), BTreeSet::new());
        for w in writers {
            let (a, r) = w.await.unwrap();
            acked.extend(a);
            rejected.extend(r);
        }
        let snapped: BTreeSet<ClusteringKey> = snap.iter().map(Record::clustering_key).collect();
        assert_eq!(
            snapped.len(),
            snap.len(),
            "round {round}: snapshot has duplicates"
        );
        assert!(
            snapped.is_disjoint(&rejected),
            "round {round}: a rejected append is visible"
        );
        assert_eq!(
            snapped, acked,
            "round {round}: snapshot differs from acknowledged appends"
        );
        assert!(
            !acked.is_empty() && !rejected.is_empty(),
            "round {round}: race not exercised"
        );
        // Once fenced, always fenced: the hot rows are exactly the acknowledged ones.
        let HotPage::Hot { rows, .. } = s.read_page(&id, &all_rows(1_000_000)).await.unwrap()
        else {
            panic!("round {round}: bucket should still be read hot");
        };
        assert_eq!(rows.num_rows(), acked.len());
        s.publish_archive(&claim, &format!("k{round}"))
            .await
            .unwrap();
    }
}

/// Claimers racing on one bucket: exactly one wins each generation, both for a fresh claim
/// and for the takeover of an expired one. Half the claimers use a second store opened on
/// the same file, so the exclusion comes from SQLite's lock, not from this process's mutex.
///
/// On a loaded machine a racer can reach the lock only after the winner's lease has run
/// out; taking the bucket over then is correct, so a later winner is accepted exactly when
/// its claim began after the previous lease expired, with the next generation. Two
/// winners inside one lease, or two with one generation, fail the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_claimers_have_exactly_one_winner_per_generation() {
    let (dir, s1) = fresh().await;
    let s2 = SqliteStore::open(dir.path().join("hot.sqlite")).unwrap();
    let stores: Vec<Arc<SqliteStore>> = vec![Arc::new(s1), Arc::new(s2)];
    let lease = Duration::from_millis(400);
    let lease_micros = i64::try_from(lease.as_micros()).unwrap();
    let mut contested = 0;
    for round in 0..20i64 {
        let (id, _) = filled(&stores[0], b"race", round, 2).await;
        let mut next_generation = 1;
        for attempt in 1..=2 {
            let mut tasks = Vec::new();
            for i in 0..6 {
                let (s, id) = (Arc::clone(&stores[i % 2]), id.clone());
                tasks.push(tokio::spawn(
                    async move { s.claim(&id, lease).await.unwrap() },
                ));
            }
            let mut winners = Vec::new();
            for t in tasks {
                winners.extend(t.await.unwrap());
            }
            winners.sort_by_key(|c| c.generation);
            assert!(
                !winners.is_empty(),
                "round {round} attempt {attempt}: nobody won a claimable bucket"
            );
            if winners.len() == 1 {
                contested += 1;
            }
            for (k, w) in winners.iter().enumerate() {
                assert_eq!(
                    w.generation,
                    next_generation + k as i64,
                    "round {round} attempt {attempt}: generations skip or repeat: {winners:?}"
                );
                if k > 0 {
                    let started = w.expires_at.as_micros() - lease_micros;
                    assert!(
                        started >= winners[k - 1].expires_at.as_micros(),
                        "round {round} attempt {attempt}: two winners inside one lease: {winners:?}"
                    );
                }
            }
            let last = winners.last().unwrap();
            next_generation = last.generation + 1;
            let meta = stores[1].bucket(&id).await.unwrap().unwrap();
            assert_eq!(meta.owner_token.as_deref(), Some(last.token.as_str()));
            if attempt == 1 {
                tokio::time::sleep(lease + Duration::from_millis(50)).await;
            }
        }
    }
    // The race must actually be run: most attempts finish inside one lease.
    assert!(
        contested >= 20,
        "only {contested} of 40 attempts raced inside one lease"
    );
}

#[tokio::test]
async fn batches_are_all_or_nothing() {
    let (_d, s) = fresh().await;
    let (fenced, _) = filled(&s, b"p", 0, 2).await;
    s.claim(&fenced, LONG).await.unwrap().unwrap();

    // A new bucket's records plus one record into the fenced bucket: nothing commits, not
    // even the new bucket's metadata.
    let fresh_rows = vec![rec(b"q", t0(), b"1", b""), rec(b"q", t0() + 1, b"2", b"")];
    let mut batch = fresh_rows.clone();
    batch.push(rec(b"p", t0() + 5, b"x", b""));
    assert!(matches!(
        s.append_batch(&tid("t"), &batch).await,
        Err(StoreError::Fenced { .. })
    ));
    assert_eq!(s.bucket(&bucket_of(&fresh_rows[0])).await.unwrap(), None);

    // A different value under an existing key aborts the whole batch.
    let ok = s.append_batch(&tid("t"), &fresh_rows).await.unwrap();
    assert_eq!((ok.inserted, ok.already_present), (2, 0));
    let batch = vec![
        rec(b"q", t0() + 2, b"3", b""),
        fresh_rows[0].clone(),
        rec(b"q", t0() + 1, b"2", b"changed"),
    ];
    assert!(matches!(
        s.append_batch(&tid("t"), &batch).await,
        Err(StoreError::DuplicateKey { .. })
    ));
    let HotPage::Hot { rows, .. } = s
        .read_page(&bucket_of(&fresh_rows[0]), &all_rows(10))
        .await
        .unwrap()
    else {
        panic!("hot");
    };
    assert_eq!(
        pulpitum::model::batch_to_records(&rows).unwrap(),
        fresh_rows
    );

    // Identical duplicates (also inside one batch) are counted, not errors.
    let again = vec![
        fresh_rows[0].clone(),
        rec(b"q", t0() + 3, b"4", b""),
        rec(b"q", t0() + 3, b"4", b""),
    ];
    let out = s.append_batch(&tid("t"), &again).await.unwrap();
    assert_eq!((out.inserted, out.already_present), (1, 2));
    assert_eq!(s.append_batch(&tid("t"), &[]).await.unwrap().inserted, 0);
    assert!(matches!(
        s.append_batch(&tid("nope"), &fresh_rows).await,
        Err(StoreError::UnknownTable(_))
    ));
}

#[tokio::test]
async fn discovery_is_oldest_first_limited_and_respects_the_cutoff() {
    let (_d, s) = fresh().await;
    // Buckets on days 5, 1, 3 (inserted out of order) and a recent one.
    let (d5, _) = filled(&s, b"a", 5, 1).await;
    let (d1, _) = filled(&s, b"b", 1, 1).await;
    let (d3, _) = filled(&s, b"a", 3, 1).await;
    let now = s.now().await.unwrap();
    filled(&s, b"a", (now.as_micros() - t0()) / DAY, 1).await;

    let work = s.discover(&Eligibility::before(now), 10).await.unwrap();
    let ids: Vec<&BucketId> = work.iter().map(|w| &w.bucket).collect();
    assert_eq!(ids, vec![&d1, &d3, &d5]);
    assert!(work.iter().all(|w| w.kind == WorkKind::Eligible));
    assert_eq!(
        s.discover(&Eligibility::before(now), 2)
            .await
            .unwrap()
            .len(),
        2
    );
    // bucket_end <= cutoff: the cutoff at the end of day 3 includes day 3, not day 5.
    let end3 = d3.bucket_key.end();
    let ids: Vec<BucketId> = s
        .discover(&Eligibility::before(end3), 10)
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.bucket)
        .collect();
    assert_eq!(ids, vec![d1.clone(), d3.clone()]);
    let just_before = EventTime::from_micros(end3.as_micros() - 1).unwrap();
    assert_eq!(
        s.discover(&Eligibility::before(just_before), 10)
            .await
            .unwrap()
            .len(),
        1
    );

    // Mixed kinds keep bucket order.
    s.claim(&d1, Duration::ZERO).await.unwrap().unwrap();
    let c3 = s.claim(&d3, LONG).await.unwrap().unwrap();
    s.publish_archive(&c3, "k3").await.unwrap();
    let now = s.now().await.unwrap();
    let kinds: Vec<(BucketId, WorkKind)> = s
        .discover(&Eligibility::before(now), 10)
        .await
        .unwrap()
        .into_iter()
        .map(|w| (w.bucket, w.kind))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (d1, WorkKind::ExpiredClaim),
            (d3, WorkKind::CleanupPending),
            (d5, WorkKind::Eligible)
        ]
    );
}

#[tokio::test]
async fn list_buckets_filters_by_partition_and_time() {
    let (_d, s) = fresh().await;
    let (a1, _) = filled(&s, b"a", 1, 1).await;
    let (a2, _) = filled(&s, b"a", 2, 1).await;
    let (b1, _) = filled(&s, b"b", 1, 1).await;
    let (c9, _) = filled(&s, b"c", 9, 1).await;
    let ids = |v: Vec<pulpitum::store::BucketMeta>| v.into_iter().map(|m| m.id).collect::<Vec<_>>();
    let t = tid("t");
    assert_eq!(
        ids(s.list_buckets(&t, &BucketFilter::default()).await.unwrap()),
        vec![a1.clone(), a2.clone(), b1.clone(), c9.clone()]
    );
    let only = BucketFilter {
        partitions: Some(vec![
            PartitionKey::new(b"c".to_vec()).unwrap(),
            PartitionKey::new(b"a".to_vec()).unwrap(),
        ]),
        ..BucketFilter::default()
    };
    assert_eq!(
        ids(s.list_buckets(&t, &only).await.unwrap()),
        vec![a1.clone(), a2.clone(), c9.clone()]
    );
    // [from, to] overlaps day 2 only: from at the first instant of day 2, to just before day 3.
    let window = BucketFilter {
        partitions: None,
        from: Some(a2.bucket_key.start()),
        to: Some(EventTime::from_micros(a2.bucket_key.end().as_micros() - 1).unwrap()),
        ..BucketFilter::default()
    };
    assert_eq!(
        ids(s.list_buckets(&t, &window).await.unwrap()),
        vec![a2.clone()]
    );
    let none = BucketFilter {
        partitions: Some(vec![]),
        ..BucketFilter::default()
    };
    assert!(s.list_buckets(&t, &none).await.unwrap().is_empty());
    let m = s.list_buckets(&t, &BucketFilter::default()).await.unwrap();
    assert!(m
        .iter()
        .all(|m| m.state == BucketState::Hot && m.generation == 0));
    assert!(s
        .list_buckets(&tid("nope"), &BucketFilter::default())
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        s.read_page(&bucket_of(&rec(b"zz", t0(), b"", b"")), &all_rows(5))
            .await
            .unwrap(),
        HotPage::Missing
    );
}

/// Bad input never reaches the store as a value: the model rejects it with a typed error,
/// and the store stays empty. Corrupt stored data is reported, never returned as rows.
#[tokio::test]
async fn bad_input_is_typed_and_writes_nothing() {
    let (dir, s) = fresh().await;
    assert!(matches!(
        BucketKey::parse(BucketStrategy::CalendarDayUtc, "day:2024-02-30"),
        Err(ModelError::MalformedBucketKey { .. })
    ));
    assert!(matches!(
        PartitionKey::new(vec![0; 513]),
        Err(ModelError::InvalidKey {
            kind: "partition",
            ..
        })
    ));
    assert!(matches!(
        SortKey::new(vec![0; 513]),
        Err(ModelError::InvalidKey { kind: "sort", .. })
    ));
    assert!(matches!(
        EventTime::from_nanos(1_700_000_000_000_000_001),
        Err(ModelError::SubMicrosecondTime(_))
    ));
    assert!(matches!(
        "calendar_week_utc".parse::<BucketStrategy>(),
        Err(ModelError::UnknownStrategy(_))
    ));
    assert!(matches!(
        s.append(&tid("missing"), &rec(b"p", t0(), b"", b"")).await,
        Err(StoreError::UnknownTable(_))
    ));
    assert!(s
        .list_buckets(&tid("t"), &BucketFilter::default())
        .await
        .unwrap()
        .is_empty());
    assert_eq!(s.tables().await.unwrap(), vec![def()]);

    // A malformed key written behind the store's back surfaces as Corrupt.
    filled(&s, b"p", 0, 1).await;
    let raw = rusqlite::Connection::open(dir.path().join("hot.sqlite")).unwrap();
    raw.busy_timeout(Duration::from_secs(5)).unwrap();
    raw.execute(
        "UPDATE pulpitum_v4_bucket_metadata SET bucket_key = 'day:2024-02-30'",
        [],
    )
    .unwrap();
    assert!(matches!(
        s.list_buckets(&tid("t"), &BucketFilter::default()).await,
        Err(StoreError::Corrupt(_))
    ));
    raw.execute(
        "UPDATE pulpitum_v4_tables SET bucket_strategy = 'calendar_day_utc'",
        [],
    )
    .unwrap();
    // The schema's CHECKs refuse unknown strategies and states outright.
    assert!(raw
        .execute(
            "UPDATE pulpitum_v4_tables SET bucket_strategy = 'weekly'",
            []
        )
        .is_err());
    assert!(raw
        .execute(
            "UPDATE pulpitum_v4_bucket_metadata SET state = 'frozen'",
            []
        )
        .is_err());
    assert!(
        raw.execute(
            "UPDATE pulpitum_v4_bucket_metadata SET state = 'archived'",
            []
        )
        .is_err(),
        "archived without an object key"
    );
}

/// Two stores on one file (as the REPL and the archiver would be): a claim through one
/// fences appends through the other.
#[tokio::test]
async fn the_fence_holds_across_connections_to_one_file() {
    let (dir, a) = fresh().await;
    let b = SqliteStore::open(dir.path().join("hot.sqlite")).unwrap();
    b.migrate().await.unwrap();
    let (id, rows) = filled(&a, b"p", 0, 3).await;
    let c = b.claim(&id, LONG).await.unwrap().unwrap();
    assert!(matches!(
        a.append(&tid("t"), &rec(b"p", t0() + 9, b"n", b"")).await,
        Err(StoreError::Fenced { .. })
    ));
    assert_eq!(snapshot_all(&b, &c, 2).await, rows);
    b.publish_archive(&c, "k").await.unwrap();
    assert_eq!(
        a.read_page(&id, &all_rows(10)).await.unwrap(),
        HotPage::Archived {
            object_key: "k".into()
        }
    );
}

/// Several processes starting at once (here: four stores on one file) migrate safely: the
/// write lock serializes them and each migration is applied exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_migrations_apply_each_version_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hot.sqlite");
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let path = path.clone();
        tasks.push(tokio::spawn(async move {
            let s = SqliteStore::open(&path).unwrap();
            s.migrate().await.unwrap();
            s.register_table(&def()).await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let raw = rusqlite::Connection::open(&path).unwrap();
    let versions: Vec<i64> = raw
        .prepare("SELECT version FROM pulpitum_v4_schema_migrations ORDER BY version")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        versions,
        (1..=17).collect::<Vec<i64>>(),
        "each version once"
    );
}

/// A store call waiting on SQLite's lock does not stall the async runtime: on a
/// single-threaded runtime, timers keep firing while an append waits for another
/// connection's write transaction, and the append completes once the lock is released.
#[tokio::test(flavor = "current_thread")]
async fn waiting_calls_do_not_block_the_runtime_thread() {
    let (dir, s) = fresh().await;
    let raw = rusqlite::Connection::open(dir.path().join("hot.sqlite")).unwrap();
    raw.execute_batch("BEGIN IMMEDIATE").unwrap();
    let append =
        tokio::spawn(async move { s.append(&tid("t"), &rec(b"p", t0(), b"k", b"v")).await });
    let started = std::time::Instant::now();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the runtime thread was blocked for {:?}",
        started.elapsed()
    );
    assert!(
        !append.is_finished(),
        "the append must still be waiting for the lock"
    );
    raw.execute_batch("COMMIT").unwrap();
    assert_eq!(append.await.unwrap().unwrap(), AppendOutcome::Inserted);
}

/// Durations beyond the supported time range are clamped to its last instant, not wrapped
/// or refused: a lease of `Duration::MAX` is simply a lease that does not expire.
#[tokio::test]
async fn extreme_durations_are_clamped_to_the_supported_range() {
    let (_d, s) = fresh().await;
    let (id, _) = filled(&s, b"p", 0, 1).await;
    let c = s.claim(&id, Duration::MAX).await.unwrap().unwrap();
    let last = EventTime::from_micros(EventTime::end_of_supported().as_micros() - 1).unwrap();
    assert_eq!(c.expires_at, last);
    assert_eq!(s.renew(&c, Duration::MAX).await.unwrap().expires_at, last);
    s.defer_archive(&c, Duration::MAX).await.unwrap();
    assert_eq!(s.bucket(&id).await.unwrap().unwrap().retry_at, Some(last));
    assert!(s.claim(&id, LONG).await.unwrap().is_none());
}

/// An older build after an upgrade (simulated: today's code against a ledger where newer
/// builds recorded migrations it does not know): it keeps running past additive migrations
/// and past breaking ones it was written for, and stops at a breaking migration that
/// requires a later build, naming both versions. A ledger from before the compatibility
/// column gets the column.
#[tokio::test]
async fn an_older_build_runs_after_additive_migrations_and_stops_at_a_breaking_one() {
    let (dir, s) = fresh().await;
    drop(s);
    let path = dir.path().join("hot.sqlite");
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch("ALTER TABLE pulpitum_v4_schema_migrations DROP COLUMN requires_version")
        .unwrap();
    let s = SqliteStore::open(&path).unwrap();
    s.migrate().await.unwrap();
    let ours: i64 = raw
        .query_row(
            "SELECT max(version) FROM pulpitum_v4_schema_migrations",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let record = |version: i64, name: &str, requires: i64| {
        raw.execute(
            "INSERT INTO pulpitum_v4_schema_migrations (version, name, checksum, applied_at, requires_version) \
             VALUES (?1, ?2, 'newer', 0, ?3)",
            rusqlite::params![version, name, requires],
        )
        .unwrap();
    };
    record(ours + 1, "newer_additive", 0);
    record(ours + 2, "newer_prepared_for", ours);
    let s = SqliteStore::open(&path).unwrap();
    s.migrate().await.unwrap();
    s.append(&tid("t"), &rec(b"p", t0(), b"k", b"v"))
        .await
        .unwrap();

    record(ours + 3, "newer_breaking", ours + 3);
    let s = SqliteStore::open(&path).unwrap();
    match s.migrate().await {
        Err(StoreError::Migration(msg)) => assert!(
            msg.contains(&format!("migration {} (newer_breaking)", ours + 3))
                && msg.contains(&format!("schema version {} or later", ours + 3))
                && msg.contains(&format!("schema version is {ours}")),
            "{msg}"
        ),
        x => panic!("expected a migration error, got {x:?}"),
    }
    // A row without a rule (written by hand) counts as breaking.
    raw.execute(
        "UPDATE pulpitum_v4_schema_migrations SET requires_version = NULL WHERE version = ?1",
        [ours + 1],
    )
    .unwrap();
    raw.execute(
        "DELETE FROM pulpitum_v4_schema_migrations WHERE version = ?1",
        [ours + 3],
    )
    .unwrap();
    let s = SqliteStore::open(&path).unwrap();
    assert!(matches!(s.migrate().await, Err(StoreError::Migration(_))));
}

/// A switch of thousands of buckets commits as one transaction, and a refusal naming a
/// bucket deep in the list writes nothing (the PostgreSQL store's test of the same name
/// covers its statement chunks). The buckets are written with SQL, archived and cleaned as
/// the lifecycle would leave them, which is what lets the test afford thousands.
#[tokio::test]
async fn a_switch_of_thousands_of_buckets_is_one_transaction() {
    use pulpitum::store::{Compaction, RouteSwitch};

    const MANY: usize = 12_000;
    let (dir, s) = fresh().await;
    let raw = rusqlite::Connection::open(dir.path().join("hot.sqlite")).unwrap();
    raw.busy_timeout(Duration::from_secs(5)).unwrap();
    let start = EventTime::parse_rfc3339("2024-03-01T00:00:00Z").unwrap();
    let end = EventTime::parse_rfc3339("2024-04-01T00:00:00Z").unwrap();
    raw.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) \
         INSERT INTO pulpitum_v4_bucket_metadata (table_id, partition_key, bucket_key, \
           bucket_strategy, bucket_start, bucket_end, state, generation, object_key, \
           hot_deleted, published_at, created_at, updated_at) \
         SELECT 't', CAST(printf('p%06d', i) AS BLOB), 'day:2024-03-01', 'calendar_day_utc', \
           ?2, ?2 + ?3, 'archived', 2, 'src/' || i || '/manifest.json', 1, ?2, ?2, ?2 \
         FROM n",
        rusqlite::params![MANY as i64, start.as_micros(), DAY],
    )
    .unwrap();
    let key = BucketKey::parse(BucketStrategy::CalendarDayUtc, "day:2024-03-01").unwrap();
    let mut switches: Vec<RouteSwitch> = (1..=MANY)
        .map(|i| RouteSwitch {
            bucket: BucketId {
                table_id: tid("t"),
                partition_key: PartitionKey::new(format!("p{i:06}").into_bytes()).unwrap(),
                bucket_key: key,
            },
            from_object_key: format!("src/{i}/manifest.json"),
            to_object_key: format!("t/segments/month:2024-03/s{:05}-g1/manifest.json", i / 1000),
            to_buckets: Some(1000),
        })
        .collect();
    let claim = s
        .claim_compaction(&tid("t"), "month:2024-03", start, end, LONG)
        .await
        .unwrap()
        .unwrap();
    let counts = || -> (i64, i64) {
        raw.query_row(
            "SELECT (SELECT count(*) FROM pulpitum_v4_bucket_metadata \
               WHERE object_key LIKE '%/segments/%'), \
             (SELECT count(*) FROM pulpitum_v4_retired_objects)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
    };

    let deep = 11_000;
    let good = std::mem::replace(
        &mut switches[deep].from_object_key,
        "src/elsewhere".to_string(),
    );
    match s.switch_routes(&claim, &switches).await {
        Err(StoreError::RouteChanged { bucket, .. }) => {
            assert_eq!(
                bucket, switches[deep].bucket,
                "the first bucket that differs"
            )
        }
        other => panic!("expected RouteChanged, got {other:?}"),
    }
    assert_eq!(counts(), (0, 0), "a refused switch writes nothing");
    switches[deep].from_object_key = good;

    let started = std::time::Instant::now();
    let n = s.switch_routes(&claim, &switches).await.unwrap();
    let took = started.elapsed();
    assert_eq!(n, MANY as u64);
    assert_eq!(counts(), (MANY as i64, MANY as i64));
    eprintln!("switched {MANY} buckets in one transaction in {took:?}");
}

/// The embedded store's migration 17 (PostgreSQL's 33 and 34): a build from before segment
/// routes still running on the file is fenced out of compaction, and the segment it
/// switched to before the fence is recorded. The file is put back to its state at migration
/// 16 (the claims table under its old name, 17 not in the ledger), the older build is
/// played by its claim, verbatim, and its switch's write (a route moved, no segment route
/// recorded), which leaves a bucket no listing across partitions names. The next open
/// migrates: the older build's claim then fails for want of its table, and the listing
/// names every bucket.
#[tokio::test]
async fn an_older_builds_compaction_is_fenced_and_what_it_switched_is_recorded() {
    use pulpitum::store::Compaction;

    let (dir, s) = fresh().await;
    drop(s);
    let path = dir.path().join("hot.sqlite");
    let raw = rusqlite::Connection::open(&path).unwrap();
    let renamed: bool = raw
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' \
             AND name = 'pulpitum_v4_compaction_claims')",
            [],
            |r| r.get(0),
        )
        .unwrap();
    if renamed {
        raw.execute_batch(
            "ALTER TABLE pulpitum_v4_compaction_claims RENAME TO pulpitum_v4_compactions",
        )
        .unwrap();
    }
    raw.execute(
        "DELETE FROM pulpitum_v4_schema_migrations WHERE version = 17",
        [],
    )
    .unwrap();
    let day = t0();
    for p in ["a", "b"] {
        raw.execute(
            "INSERT INTO pulpitum_v4_bucket_metadata (table_id, partition_key, bucket_key, \
               bucket_strategy, bucket_start, bucket_end, state, generation, object_key, \
               hot_deleted, published_at, created_at, updated_at) \
             VALUES ('t', ?1, 'day:2024-03-10', 'calendar_day_utc', ?2, ?3, 'archived', 2, \
               ?4, 1, 0, 0, 0)",
            rusqlite::params![p.as_bytes(), day, day + DAY, format!("t/{p}/manifest.json")],
        )
        .unwrap();
    }
    // The older build's claim (c3bb186, verbatim), then its switch of bucket a.
    let older_claim = |window: &str| {
        raw.execute(
            "INSERT INTO pulpitum_v4_compactions (table_id, window_key, window_start, \
               window_end, owner_token, generation, lease_expires_at, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            rusqlite::params![
                "t",
                window,
                day,
                day + 30 * DAY,
                "old-build",
                1,
                i64::MAX,
                0
            ],
        )
    };
    older_claim("month:2024-03").unwrap();
    let segment = "t/segments/month:2024-03/s00001-g1/manifest.json";
    let switched = raw
        .execute(
            "UPDATE pulpitum_v4_bucket_metadata SET object_key = ?1 \
             WHERE table_id = 't' AND partition_key = ?2 AND object_key = 't/a/manifest.json'",
            rusqlite::params![segment, b"a".as_slice()],
        )
        .unwrap();
    assert_eq!(switched, 1);
    // And bucket b, to a segment recorded with a window its day lies outside (see the
    // PostgreSQL test of the same name).
    let recorded_segment = "t/segments/month:2024-03/s00002-g1/manifest.json";
    raw.execute(
        "INSERT INTO pulpitum_v4_segment_routes \
           (table_id, object_key, window_start, window_end, buckets) VALUES ('t', ?1, ?2, ?3, -1)",
        rusqlite::params![recorded_segment, day + 5 * DAY, day + 6 * DAY],
    )
    .unwrap();
    raw.execute(
        "UPDATE pulpitum_v4_bucket_metadata SET object_key = ?1 \
         WHERE table_id = 't' AND partition_key = ?2 AND object_key = 't/b/manifest.json'",
        rusqlite::params![recorded_segment, b"b".as_slice()],
    )
    .unwrap();
    raw.execute(
        "UPDATE pulpitum_v4_compactions SET owner_token = NULL, lease_expires_at = NULL",
        [],
    )
    .unwrap();
    let march = (
        EventTime::from_micros(day).unwrap(),
        EventTime::from_micros(day + 2 * DAY).unwrap(),
    );
    let across = |s: SqliteStore| async move {
        let listing = s
            .list_across(&tid("t"), march.0, march.1)
            .await
            .unwrap()
            .unwrap();
        assert!(listing.segments.is_empty(), "{:?}", listing.segments);
        let mut named: Vec<Vec<u8>> = listing
            .buckets
            .iter()
            .map(|m| m.id.partition_key.as_bytes().to_vec())
            .collect();
        named.sort();
        (s, named)
    };
    // Opened without migrating, the file as the older build left it: the damage the fence
    // prevents.
    let (s, named) = across(SqliteStore::open(&path).unwrap()).await;
    assert!(
        named.is_empty(),
        "buckets a and b are listed nowhere: {named:?}"
    );
    drop(s);

    let s = SqliteStore::open(&path).unwrap();
    s.migrate().await.unwrap();
    // A window never claimed: without the fence, its first claim would succeed.
    let refused = older_claim("month:2024-04").unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("no such table: pulpitum_v4_compactions"),
        "an older build's claim must fail once migration 17 is applied: {refused}"
    );
    let (s, named) = across(s).await;
    assert_eq!(
        named,
        [b"a".to_vec(), b"b".to_vec()],
        "migration 17 records the segment the older build switched to, and widens the \
         window of the segment recorded already"
    );
    let routes: Vec<(String, i64)> = raw
        .prepare("SELECT object_key, buckets FROM pulpitum_v4_segment_routes ORDER BY object_key")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        routes,
        [
            (segment.to_string(), -1),
            (recorded_segment.to_string(), -1)
        ]
    );
    let claim = s
        .claim_compaction(
            &tid("t"),
            "month:2024-03",
            march.0,
            EventTime::from_micros(day + 30 * DAY).unwrap(),
            LONG,
        )
        .await
        .unwrap()
        .expect("this build claims the window the older build released");
    assert_eq!(claim.generation, 2, "the claim row kept its generation");
}
