//! Conformance cases for the archiving lifecycle (`Lifecycle` in `src/store/roles.rs`):
//! claim, renew, snapshot, defer, publish and cleanup through every state, each step
//! checking token, generation and lease in the statement that writes (ARCHITECTURE.md
//! invariant 3) and being safe to retry (9); racing claimers; and the queries the archiver
//! and garbage collection rely on (discovery, backlog, referenced object keys).
//!
//! # Rejections
//!
//! Expired leases, forged or stale tokens and generations, and transitions the state does
//! not allow are refused with typed errors and write nothing; those cases sit together in
//! the middle of the file.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use pulpitum::model::batch_to_records;
use pulpitum::model::{BucketId, BucketKey, BucketStrategy, EventTime, Record, ScanBounds};
use pulpitum::store::{
    AppendOutcome, Backlog, BucketState, Claim, Eligibility, HotPage, PageRequest, StoreError,
    TableLag, WorkKind,
};

use super::{
    all_rows, assert_invalid, assert_stale, bucket_of, pk, rec, snapshot_all, state_of, t, table,
    Store, LONG, PAST_SHORT, SHORT,
};

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

    let work = store
        .discover(&Eligibility::before(cutoff), 10)
        .await
        .unwrap();
    assert_eq!(work.len(), 1);
    assert_eq!(
        (work[0].bucket.clone(), work[0].kind),
        (b.clone(), WorkKind::Eligible)
    );
    assert!(
        store
            .discover(&Eligibility::before(t("2021-06-01T23:59:59Z")), 10)
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
        store
            .discover(&Eligibility::before(cutoff), 10)
            .await
            .unwrap()
            .is_empty(),
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
    let work = store
        .discover(&Eligibility::before(cutoff), 10)
        .await
        .unwrap();
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
    assert!(store
        .discover(&Eligibility::before(cutoff), 10)
        .await
        .unwrap()
        .is_empty());
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
    assert!(store
        .discover(&Eligibility::before(cutoff), 10)
        .await
        .unwrap()
        .is_empty());
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
        .discover(&Eligibility::before(t("2030-01-01T00:00:00Z")), 10)
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
    let work = store
        .discover(&Eligibility::before(t("2030-01-01T00:00:00Z")), 10)
        .await
        .unwrap();
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
    let work = store
        .discover(&Eligibility::before(t("2021-01-01T00:00:00Z")), 10)
        .await
        .unwrap();
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

/// Claimers racing for one bucket: exactly one wins each generation.
pub async fn racing_claimers(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let tbl = table(&store, "events", s).await;
    let r = rec("p", t("2021-06-01T00:00:00Z"), b"1", b"v");
    store.append(&tbl, &r).await.unwrap();
    let b = bucket_of(&tbl, s, &r);
    let mut tokens = BTreeSet::new();
    let lease = Duration::from_millis(250);
    let lease_micros = i64::try_from(lease.as_micros()).unwrap();
    // On a loaded machine a racer may reach the store only after the winner's lease ran
    // out; its takeover is then correct. A later winner is accepted exactly when its claim
    // began after the previous lease expired, with the next generation.
    let (mut generation, mut contested) = (1i64, 0);
    for attempt in 1..=6 {
        let barrier = Arc::new(tokio::sync::Barrier::new(6));
        let mut tasks = Vec::new();
        for _ in 0..6 {
            let (store, b, barrier) = (store.clone(), b.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                store.claim(&b, lease).await.unwrap()
            }));
        }
        let mut winners = Vec::new();
        for task in tasks {
            if let Some(c) = task.await.unwrap() {
                winners.push(c);
            }
        }
        winners.sort_by_key(|c| c.generation);
        assert!(!winners.is_empty(), "attempt {attempt}: nobody won");
        if winners.len() == 1 {
            contested += 1;
        }
        for (k, w) in winners.iter().enumerate() {
            assert_eq!(
                w.generation,
                generation + k as i64,
                "attempt {attempt}: generations skip or repeat: {winners:?}"
            );
            assert!(tokens.insert(w.token.clone()), "tokens are fresh");
            if k > 0 {
                assert!(
                    w.expires_at.as_micros() - lease_micros
                        >= winners[k - 1].expires_at.as_micros(),
                    "attempt {attempt}: two winners inside one lease: {winners:?}"
                );
            }
        }
        generation = winners.last().unwrap().generation;
        assert_eq!(
            store.bucket(&b).await.unwrap().unwrap().generation,
            generation
        );
        generation += 1;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert!(
        contested >= 3,
        "only {contested} of 6 attempts raced inside one lease"
    );
}

// ---------------------------------------------------------------------------------------
// discovery and backlog

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
    let work = store
        .discover(&Eligibility::before(cutoff), 100)
        .await
        .unwrap();
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
    let first_two = store
        .discover(&Eligibility::before(cutoff), 2)
        .await
        .unwrap();
    assert_eq!(first_two, work[..2].to_vec());
    assert!(store
        .discover(&Eligibility::before(cutoff), 0)
        .await
        .unwrap()
        .is_empty());
}

/// The backlog counts Hot buckets ended by the cutoff (a deferred one included) and
/// claimed, unpublished ones; published buckets and buckets after the cutoff are not counted.
pub async fn backlog_counts_eligible_and_archiving(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let cutoff = t("2021-06-06T00:00:00Z");
    let tbl = table(&store, "events", s).await;
    assert_eq!(
        store.backlog(&Eligibility::before(cutoff)).await.unwrap(),
        Backlog::default()
    );
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
    let counts = |eligible, archiving| (eligible, archiving);
    let got = |b: Backlog| (b.eligible, b.archiving);
    // Five days end by the cutoff; 06-09 does not.
    let b = store.backlog(&Eligibility::before(cutoff)).await.unwrap();
    assert_eq!(
        b.tables,
        vec![TableLag {
            table_id: tbl.clone(),
            eligible: 5,
            oldest_eligible_end: Some(t("2021-06-02T00:00:00Z")),
        }]
    );
    assert_eq!(got(b), counts(5, 0));
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
    let b = store.backlog(&Eligibility::before(cutoff)).await.unwrap();
    // The lag is the oldest eligible bucket not yet archived: 06-02 (deferred) now.
    assert_eq!(
        b.tables,
        vec![TableLag {
            table_id: tbl.clone(),
            eligible: 2,
            oldest_eligible_end: Some(t("2021-06-03T00:00:00Z")),
        }]
    );
    assert_eq!(got(b), counts(2, 2));
    // The cutoff bounds only the eligible count.
    assert_eq!(
        got(store
            .backlog(&Eligibility::before(t("2030-01-01T00:00:00Z")))
            .await
            .unwrap()),
        counts(3, 2)
    );
}

/// GC's reads that follow the work: the in-flight claims alone, the routes among given
/// keys, and the noted prefixes (noted at the store's clock, read once old enough, oldest
/// first; a noting again refreshes a row, and a row is forgotten only as it was read).
pub async fn gc_reads_claims_routes_and_noted_prefixes(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let tbl = table(&store, "events", s).await;
    for d in ["01", "02", "03"] {
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
    // 06-01 in flight, 06-02 published to `m2`, 06-03 hot.
    store.claim(&id("01"), LONG).await.unwrap().unwrap();
    let c = store.claim(&id("02"), LONG).await.unwrap().unwrap();
    store
        .publish_archive(&c, "x/m2/manifest.json")
        .await
        .unwrap();
    let claims = store.archiving_claims().await.unwrap();
    assert_eq!(
        claims.iter().map(|m| m.id.clone()).collect::<Vec<_>>(),
        vec![id("01")]
    );
    let asked: Vec<String> = [
        "x/m2/manifest.json",
        "x/m1/manifest.json",
        "x/m2/manifest.json",
    ]
    .map(String::from)
    .to_vec();
    assert_eq!(
        store.routed_among(&asked).await.unwrap(),
        vec!["x/m2/manifest.json".to_string()]
    );
    assert!(store.routed_among(&[]).await.unwrap().is_empty());
    // More keys than one statement takes: the routed one is found wherever it is.
    let mut many: Vec<String> = (0..2_500)
        .map(|i| format!("x/n{i}/manifest.json"))
        .collect();
    many.push("x/m2/manifest.json".into());
    assert_eq!(
        store.routed_among(&many).await.unwrap(),
        vec!["x/m2/manifest.json".to_string()]
    );

    assert!(store
        .gc_prefixes(Duration::ZERO, "", 10)
        .await
        .unwrap()
        .is_empty());
    let a = store.note_gc_prefix("x/a/").await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let b = store.note_gc_prefix("x/b/").await.unwrap();
    assert!(a.recorded_at < b.recorded_at);
    // Only rows old enough, oldest first, at most `limit`.
    assert!(store.gc_prefixes(LONG, "", 10).await.unwrap().is_empty());
    assert_eq!(
        store.gc_prefixes(Duration::ZERO, "", 10).await.unwrap(),
        vec![a.clone(), b.clone()]
    );
    assert_eq!(
        store.gc_prefixes(Duration::ZERO, "", 1).await.unwrap(),
        vec![a.clone()]
    );
    assert!(store
        .gc_prefixes(Duration::ZERO, "", 0)
        .await
        .unwrap()
        .is_empty());
    // Only one root's notings, matched literally (`_` and `%` are no wildcards).
    let other = store.note_gc_prefix("y_%/c/").await.unwrap();
    assert_eq!(
        store.gc_prefixes(Duration::ZERO, "x/", 10).await.unwrap(),
        vec![a.clone(), b.clone()]
    );
    assert_eq!(
        store.gc_prefixes(Duration::ZERO, "y_%/", 10).await.unwrap(),
        vec![other.clone()]
    );
    assert!(store
        .gc_prefixes(Duration::ZERO, "y__/", 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(store.forget_gc_prefixes(&[other]).await.unwrap(), 1);
    // `a` noted again after GC read it: forgetting the row as read leaves the new one.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let a2 = store.note_gc_prefix("x/a/").await.unwrap();
    assert!(a2.recorded_at > a.recorded_at);
    assert_eq!(
        store
            .forget_gc_prefixes(&[a.clone(), b.clone()])
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store.gc_prefixes(Duration::ZERO, "", 10).await.unwrap(),
        vec![a2.clone()]
    );
    assert_eq!(store.forget_gc_prefixes(&[a2]).await.unwrap(), 1);
    assert!(store
        .gc_prefixes(Duration::ZERO, "", 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(store.forget_gc_prefixes(&[]).await.unwrap(), 0);
}
