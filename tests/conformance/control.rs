//! Conformance cases for the control plane (`Control` in `src/store/roles.rs`, and what
//! `Lifecycle` makes of it): policy updates that keep what they do not name, pauses that stop
//! new archive claims in the claiming statement while cleanup goes on, eligibility by
//! `archive_after` under an optional ceiling, the larger of two cleanup delays, and job
//! history with abandoned attempts and pruning.

use std::time::Duration;

use pulpitum::model::{BucketId, BucketKey, BucketStrategy, EventTime};
use pulpitum::store::{
    Eligibility, JobEnd, JobFilter, JobKind, JobOutcome, JobStart, PolicyUpdate, StoreError,
    WorkKind,
};

use super::{bucket_of, pk, rec, t, table, tid, Store, LONG};

const DAY: i64 = 86_400_000_000;

fn days(n: u64) -> Duration {
    Duration::from_secs(n * 86_400)
}

/// A policy update changes only the fields it names; an unknown table is refused.
pub async fn policies_update_only_what_they_name(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let tbl = table(&store, "events", s).await;
    assert!(store.policies().await.unwrap().is_empty());
    match store
        .update_policy(&tid("nope"), &PolicyUpdate::default())
        .await
    {
        Err(StoreError::UnknownTable(t)) => assert_eq!(t.as_str(), "nope"),
        other => panic!("expected UnknownTable, got {other:?}"),
    }
    let p = store
        .update_policy(
            &tbl,
            &PolicyUpdate {
                archive_after: Some(Some(days(90))),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(p.archive_after, Some(days(90)));
    assert!(p.updated_at.is_some());
    let p = store
        .update_policy(
            &tbl,
            &PolicyUpdate {
                format: Some(Some("json".into())),
                cleanup_delay: Some(Some(Duration::from_secs(7200))),
                paused: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(p.archive_after, Some(days(90)), "kept");
    assert_eq!(p.format.as_deref(), Some("json"));
    assert_eq!(p.cleanup_delay, Some(Duration::from_secs(7200)));
    assert!(p.paused);
    let p = store
        .update_policy(
            &tbl,
            &PolicyUpdate {
                archive_after: Some(None),
                paused: Some(false),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(p.archive_after, None);
    assert_eq!(p.format.as_deref(), Some("json"), "kept");
    assert!(!p.paused);
    assert_eq!(store.policies().await.unwrap(), vec![p]);
    assert!(!store.store_paused().await.unwrap());
    store.set_store_paused(true).await.unwrap();
    assert!(store.store_paused().await.unwrap());
    store.set_store_paused(false).await.unwrap();
    assert!(!store.store_paused().await.unwrap());
}

/// A paused table, then a paused store, gets no archive claims and no archive work, while
/// published buckets' cleanup is still found and claimed; resuming restores both.
pub async fn pauses_stop_claims_but_not_cleanup(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let a = table(&store, "events_a", s).await;
    let b = table(&store, "events_b", s).await;
    let ra = rec("p", t("2021-06-01T12:00:00Z"), b"1", b"v");
    let ra2 = rec("p", t("2021-06-02T12:00:00Z"), b"1", b"v");
    let rb = rec("p", t("2021-06-01T12:00:00Z"), b"1", b"v");
    store.append(&a, &ra).await.unwrap();
    store.append(&a, &ra2).await.unwrap();
    store.append(&b, &rb).await.unwrap();
    let (ba, ba2, bb) = (
        bucket_of(&a, s, &ra),
        bucket_of(&a, s, &ra2),
        bucket_of(&b, s, &rb),
    );
    // One published bucket of table a, whose cleanup must go on through every pause.
    let c = store.claim(&ba2, LONG).await.unwrap().unwrap();
    store.publish_archive(&c, "m").await.unwrap();
    let rule = Eligibility::before(t("2030-01-01T00:00:00Z"));
    let work = |store: Store| async move {
        let mut w: Vec<(String, WorkKind)> = store
            .discover(&rule, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|i| (i.bucket.table_id.to_string(), i.kind))
            .collect();
        w.sort_by_key(|(t, k)| (t.clone(), format!("{k:?}")));
        w
    };
    let pause = |paused| PolicyUpdate {
        paused: Some(paused),
        ..Default::default()
    };
    store.update_policy(&a, &pause(true)).await.unwrap();
    assert_eq!(
        work(store.clone()).await,
        vec![
            ("events_a".into(), WorkKind::CleanupPending),
            ("events_b".into(), WorkKind::Eligible)
        ]
    );
    assert_eq!(store.claim(&ba, LONG).await.unwrap(), None, "table paused");
    let cb = store
        .claim(&bb, Duration::from_millis(1))
        .await
        .unwrap()
        .unwrap();
    // Store-wide: nothing to archive anywhere, an expired claim is not taken over, cleanup
    // still claimable.
    store.update_policy(&a, &pause(false)).await.unwrap();
    store.set_store_paused(true).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        work(store.clone()).await,
        vec![("events_a".into(), WorkKind::CleanupPending)]
    );
    assert_eq!(store.claim(&ba, LONG).await.unwrap(), None, "store paused");
    assert_eq!(store.claim(&bb, LONG).await.unwrap(), None, "no takeover");
    let cleanup = store.claim_cleanup(&ba2, LONG).await.unwrap().unwrap();
    assert!(cleanup.generation > c.generation);
    // Resumed: both archive items are back and claimable.
    store.set_store_paused(false).await.unwrap();
    let w = work(store.clone()).await;
    assert!(
        w.contains(&("events_a".into(), WorkKind::Eligible)),
        "{w:?}"
    );
    assert!(
        w.contains(&("events_b".into(), WorkKind::ExpiredClaim)),
        "{w:?}"
    );
    assert!(store.claim(&ba, LONG).await.unwrap().is_some());
    let taken = store.claim(&bb, LONG).await.unwrap().unwrap();
    assert_eq!(taken.generation, cb.generation + 1);
}

/// `archive_after` decides a policied table's eligibility by the store's clock; a table
/// without a policy uses the cutoff; a ceiling bounds both, and never widens a policy.
pub async fn archive_after_and_the_ceiling_decide_eligibility(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let pol = table(&store, "with_policy", s).await;
    let plain = table(&store, "without_policy", s).await;
    let now = store.now().await.unwrap().as_micros();
    // One record at noon of each of the last 12 days, in both tables.
    let noon = |back: i64| {
        let day = now.div_euclid(DAY) - back;
        EventTime::from_micros(day * DAY + DAY / 2).unwrap()
    };
    for back in 1..=12 {
        for tbl in [&pol, &plain] {
            store
                .append(tbl, &rec("p", noon(back), b"1", b"v"))
                .await
                .unwrap();
        }
    }
    let end = |back: i64| (now.div_euclid(DAY) - back + 1) * DAY;
    store
        .update_policy(
            &pol,
            &PolicyUpdate {
                archive_after: Some(Some(days(5))),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let eligible = |rule: Eligibility, store: Store| async move {
        let mut per: Vec<(String, i64)> = store
            .discover(&rule, 100)
            .await
            .unwrap()
            .into_iter()
            .filter(|i| i.kind == WorkKind::Eligible)
            .map(|i| {
                (
                    i.bucket.table_id.to_string(),
                    i.bucket.bucket_key.end().as_micros(),
                )
            })
            .collect();
        per.sort();
        per
    };
    let expect = |tbl: &str, bound: i64| -> Vec<(String, i64)> {
        (1..=12)
            .map(end)
            .filter(|e| *e <= bound)
            .map(|e| (tbl.to_string(), e))
            .rev()
            .collect()
    };
    let policy_bound = now - 5 * DAY;
    // No ceiling, a cutoff before everything: the policy alone admits its table's buckets.
    let early = EventTime::from_micros(end(12) - DAY).unwrap();
    assert_eq!(
        eligible(
            Eligibility {
                cutoff: early,
                ceiling: false
            },
            store.clone()
        )
        .await,
        expect("with_policy", policy_bound)
    );
    // No ceiling, a cutoff after everything: the plain table takes it, the policy holds back.
    let late = EventTime::from_micros(end(1)).unwrap();
    let mut both = expect("with_policy", policy_bound);
    both.extend(expect("without_policy", late.as_micros()));
    both.sort();
    assert_eq!(
        eligible(
            Eligibility {
                cutoff: late,
                ceiling: false
            },
            store.clone()
        )
        .await,
        both
    );
    // A ceiling 8 days back bounds both tables; it never admits what the policy holds.
    let ceiling = EventTime::from_micros(now - 8 * DAY).unwrap();
    let mut both = expect("with_policy", ceiling.as_micros());
    both.extend(expect("without_policy", ceiling.as_micros()));
    both.sort();
    assert_eq!(
        eligible(Eligibility::before(ceiling), store.clone()).await,
        both
    );
    let mut both = expect("with_policy", policy_bound);
    both.extend(expect("without_policy", late.as_micros()));
    both.sort();
    assert_eq!(
        eligible(Eligibility::before(late), store.clone()).await,
        both
    );
    // The backlog counts by the same rule, per table.
    let b = store
        .backlog(&Eligibility {
            cutoff: early,
            ceiling: false,
        })
        .await
        .unwrap();
    assert_eq!(b.tables.len(), 1);
    assert_eq!(b.tables[0].table_id, pol);
    assert_eq!(
        b.tables[0].eligible as usize,
        expect("x", policy_bound).len()
    );
    assert_eq!(
        b.tables[0].oldest_eligible_end.map(|e| e.as_micros()),
        Some(end(12))
    );
}

/// A published bucket's cleanup is due after the larger of the archiver's delay and its
/// table's policy delay.
pub async fn cleanup_waits_for_the_longer_delay(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let tbl = table(&store, "events", s).await;
    let r = rec("p", t("2021-06-01T12:00:00Z"), b"1", b"v");
    store.append(&tbl, &r).await.unwrap();
    let b = bucket_of(&tbl, s, &r);
    let c = store.claim(&b, LONG).await.unwrap().unwrap();
    store.publish_archive(&c, "m").await.unwrap();
    let rule = Eligibility::before(t("2030-01-01T00:00:00Z"));
    let cleanups = |store: Store, delay: Duration| async move {
        store
            .discover_ready(&rule, 10, delay)
            .await
            .unwrap()
            .into_iter()
            .filter(|i| i.kind == WorkKind::CleanupPending)
            .count()
    };
    assert_eq!(cleanups(store.clone(), Duration::ZERO).await, 1);
    assert_eq!(
        cleanups(store.clone(), LONG).await,
        0,
        "the archiver's delay"
    );
    let set = |d: Option<Duration>| PolicyUpdate {
        cleanup_delay: Some(d),
        ..Default::default()
    };
    store.update_policy(&tbl, &set(Some(LONG))).await.unwrap();
    assert_eq!(
        cleanups(store.clone(), Duration::ZERO).await,
        0,
        "the policy's"
    );
    store
        .update_policy(&tbl, &set(Some(Duration::ZERO)))
        .await
        .unwrap();
    assert_eq!(
        cleanups(store.clone(), LONG).await,
        0,
        "a shorter policy never lowers the archiver's"
    );
    store.update_policy(&tbl, &set(None)).await.unwrap();
    assert_eq!(cleanups(store.clone(), Duration::ZERO).await, 1);
}

/// Job history: a start is running; a later generation's start marks it abandoned; an end
/// overwrites (and writes a missing start); filters and pruning.
pub async fn job_history_records_abandons_and_prunes(store: Store) {
    let s = BucketStrategy::CalendarDayUtc;
    let tbl = table(&store, "events", s).await;
    let other = table(&store, "other", s).await;
    let bucket = |tbl: &pulpitum::model::TableId| BucketId {
        table_id: tbl.clone(),
        partition_key: pk("p"),
        bucket_key: BucketKey::parse(s, "day:2021-06-01").unwrap(),
    };
    let job = |tbl, generation, kind, worker: &str| JobStart {
        bucket: bucket(tbl),
        generation,
        kind,
        worker: worker.into(),
    };
    let before = store.now().await.unwrap();
    store
        .record_job_start(&job(&tbl, 1, JobKind::Archive, "w1"))
        .await
        .unwrap();
    // Idempotent.
    store
        .record_job_start(&job(&tbl, 1, JobKind::Archive, "w1"))
        .await
        .unwrap();
    let all = store.jobs(&JobFilter::default()).await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].outcome, JobOutcome::Running);
    assert_eq!(all[0].finished_at, None);
    assert_eq!(all[0].bucket, bucket(&tbl));
    assert!(all[0].started_at >= before);
    // w1 died; w2 takes over with generation 2.
    store
        .record_job_start(&job(&tbl, 2, JobKind::Archive, "w2"))
        .await
        .unwrap();
    store
        .record_job_end(&JobEnd {
            job: job(&tbl, 2, JobKind::Archive, "w2"),
            outcome: JobOutcome::Published,
            rows: Some(7),
            bytes: Some(1234),
            error: None,
        })
        .await
        .unwrap();
    // An end whose start was never written writes the whole row.
    store
        .record_job_end(&JobEnd {
            job: job(&tbl, 3, JobKind::Cleanup, "w3"),
            outcome: JobOutcome::Failed,
            rows: None,
            bytes: None,
            error: Some("x".repeat(5_000)),
        })
        .await
        .unwrap();
    store
        .record_job_start(&job(&other, 1, JobKind::Archive, "w1"))
        .await
        .unwrap();
    let mut mine = store
        .jobs(&JobFilter {
            table: Some(tbl.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    mine.sort_by_key(|j| j.generation);
    let summary: Vec<(i64, JobOutcome, &str)> = mine
        .iter()
        .map(|j| (j.generation, j.outcome, j.worker.as_str()))
        .collect();
    assert_eq!(
        summary,
        vec![
            (1, JobOutcome::Abandoned, "w1"),
            (2, JobOutcome::Published, "w2"),
            (3, JobOutcome::Failed, "w3"),
        ]
    );
    assert!(mine[0].finished_at.is_some());
    assert_eq!((mine[1].rows, mine[1].bytes), (Some(7), Some(1234)));
    assert_eq!(mine[2].kind, JobKind::Cleanup);
    assert!(
        mine[2].error.as_ref().unwrap().len() < 1_100,
        "error text is clipped"
    );
    let limited = store
        .jobs(&JobFilter {
            limit: Some(2),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(limited.len(), 2);
    let future = t("2100-01-01T00:00:00Z");
    assert!(store
        .jobs(&JobFilter {
            since: Some(future),
            ..Default::default()
        })
        .await
        .unwrap()
        .is_empty());
    // Pruning: nothing started before `before`; then everything, in batches.
    assert_eq!(store.prune_jobs(before, 100).await.unwrap(), 0);
    assert_eq!(store.prune_jobs(future, 2).await.unwrap(), 2);
    assert_eq!(store.prune_jobs(future, 0).await.unwrap(), 0);
    assert_eq!(store.prune_jobs(future, 100).await.unwrap(), 2);
    assert!(store.jobs(&JobFilter::default()).await.unwrap().is_empty());
}
