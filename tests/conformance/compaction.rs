//! Conformance cases for segment compaction's registry (`Compaction` in
//! `src/store/roles.rs`; docs/segments.md, sections 5 to 7): window claims fenced by token,
//! generation and lease like bucket claims (ARCHITECTURE.md invariant 3), the candidates and
//! a window's state, the route switch that moves every route of a window or none, and the
//! retired objects garbage collection waits on.
//!
//! # Refusals write nothing
//!
//! Every refused switch is followed by a look at every route of the table and at the
//! retired list: a refusal that wrote part of a switch (one bucket's route, one retired
//! key) fails the case, whichever check refused it.

use std::time::Duration;

use pulpitum::model::{BucketId, BucketStrategy, TableId};
use pulpitum::store::{
    BucketFilter, BucketState, CompactionClaim, CompactionSource, HotPage, PageRequest,
    RouteSwitch, StoreError,
};

use super::{bucket_of, rec, t, table, tid, Store, LONG, PAST_SHORT, SHORT};

const DAY: BucketStrategy = BucketStrategy::CalendarDayUtc;

/// A bucket of `tbl` holding one record of `partition` at `at`, archived to `object_key`
/// and, when `clean`, with its hot rows deleted, through the lifecycle API.
async fn archived(
    store: &Store,
    tbl: &TableId,
    partition: &str,
    at: &str,
    object_key: &str,
    clean: bool,
) -> BucketId {
    let r = rec(partition, t(at), b"k", b"v");
    store.append(tbl, &r).await.unwrap();
    let b = bucket_of(tbl, DAY, &r);
    let claim = store.claim(&b, LONG).await.unwrap().expect("archive claim");
    store.publish_archive(&claim, object_key).await.unwrap();
    if clean {
        let cleaner = store
            .claim_cleanup(&b, LONG)
            .await
            .unwrap()
            .expect("cleanup claim");
        while !store
            .cleanup_step(&cleaner, 100, Duration::ZERO)
            .await
            .unwrap()
            .1
        {}
    }
    b
}

/// A hot bucket of `tbl` holding one record of `partition` at `at`.
async fn hot(store: &Store, tbl: &TableId, partition: &str, at: &str) -> BucketId {
    let r = rec(partition, t(at), b"k", b"v");
    store.append(tbl, &r).await.unwrap();
    bucket_of(tbl, DAY, &r)
}

/// The window of March 2024 of `tbl`.
async fn claim_march(store: &Store, tbl: &TableId, lease: Duration) -> Option<CompactionClaim> {
    store
        .claim_compaction(
            tbl,
            "month:2024-03",
            t("2024-03-01T00:00:00Z"),
            t("2024-04-01T00:00:00Z"),
            lease,
        )
        .await
        .unwrap()
}

fn switch(b: &BucketId, from: &str, to: &str) -> RouteSwitch {
    RouteSwitch {
        bucket: b.clone(),
        from_object_key: from.into(),
        to_object_key: to.into(),
        to_buckets: None,
    }
}

/// Every bucket of `tbl` with its state (route included), for "nothing was written".
async fn routes(store: &Store, tbl: &TableId) -> Vec<(BucketId, BucketState)> {
    store
        .list_buckets(tbl, &BucketFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|m| (m.id, m.state))
        .collect()
}

fn retired_keys(list: &[pulpitum::store::RetiredObject]) -> Vec<String> {
    list.iter().map(|r| r.object_key.clone()).collect()
}

fn assert_stale_compaction<T: std::fmt::Debug>(
    r: Result<T, StoreError>,
    claim: &CompactionClaim,
    what: &str,
) -> String {
    match r {
        Err(e @ StoreError::StaleCompaction { .. }) => {
            assert!(!e.is_retryable(), "{what}: a stale claim is final");
            let StoreError::StaleCompaction {
                table_id,
                window_key,
                generation,
                reason,
            } = e
            else {
                unreachable!()
            };
            assert_eq!(
                (&table_id, &window_key, generation),
                (&claim.table_id, &claim.window_key, claim.generation),
                "{what}: the error names the caller's claim"
            );
            reason
        }
        other => panic!("{what}: expected StaleCompaction, got {other:?}"),
    }
}

fn assert_route_changed<T: std::fmt::Debug>(
    r: Result<T, StoreError>,
    bucket: &BucketId,
    what: &str,
) -> String {
    match r {
        Err(e @ StoreError::RouteChanged { .. }) => {
            assert!(!e.is_retryable(), "{what}: a changed route is final");
            let StoreError::RouteChanged {
                bucket: got,
                reason,
            } = e
            else {
                unreachable!()
            };
            assert_eq!(&got, bucket, "{what}: names the first bucket that differs");
            reason
        }
        other => panic!("{what}: expected RouteChanged on {bucket}, got {other:?}"),
    }
}

/// Claim, exclusivity while live, renewal, expiry and takeover with generation + 1, and the
/// old claim refused everywhere after it (its release a no-op that leaves the new claim
/// alone); forged tokens and generations; release makes a window claimable at once.
pub async fn compaction_claims_are_fenced_by_token_generation_and_lease(store: Store) {
    let tbl = table(&store, "events", DAY).await;
    let before = store.now().await.unwrap();
    let first = claim_march(&store, &tbl, SHORT).await.expect("first claim");
    assert_eq!(first.table_id, tbl);
    assert_eq!(first.window_key, "month:2024-03");
    assert_eq!(first.window_start, t("2024-03-01T00:00:00Z"));
    assert_eq!(first.window_end, t("2024-04-01T00:00:00Z"));
    assert_eq!(first.generation, 1);
    assert!(
        first.lease_expires_at > before,
        "the lease is on the store's clock"
    );
    assert!(
        claim_march(&store, &tbl, LONG).await.is_none(),
        "a live claim is exclusive"
    );
    assert_eq!(
        store.compaction_claims().await.unwrap(),
        vec![first.clone()]
    );
    let other = store
        .claim_compaction(
            &tbl,
            "month:2024-04",
            t("2024-04-01T00:00:00Z"),
            t("2024-05-01T00:00:00Z"),
            LONG,
        )
        .await
        .unwrap()
        .expect("another window is claimed on its own");
    assert_eq!(other.generation, 1);

    let renewed = store.renew_compaction(&first, SHORT).await.unwrap();
    assert!(renewed.lease_expires_at >= first.lease_expires_at);
    assert_eq!(
        (&renewed.owner_token, renewed.generation),
        (&first.owner_token, first.generation)
    );

    tokio::time::sleep(PAST_SHORT).await;
    let reason = assert_stale_compaction(
        store.renew_compaction(&renewed, LONG).await,
        &renewed,
        "renewing an expired claim",
    );
    assert!(reason.contains("expired"), "{reason}");
    let second = claim_march(&store, &tbl, LONG)
        .await
        .expect("an expired claim is taken over");
    assert_eq!(second.generation, 2);
    assert_ne!(second.owner_token, first.owner_token);

    let reason = assert_stale_compaction(
        store.renew_compaction(&renewed, LONG).await,
        &renewed,
        "renewing a superseded claim",
    );
    assert!(reason.contains("generation"), "{reason}");
    assert_stale_compaction(
        store.switch_routes(&renewed, &[]).await,
        &renewed,
        "switching under a superseded claim",
    );
    store.release_compaction(&renewed).await.unwrap();
    assert_eq!(
        store.compaction_claims().await.unwrap(),
        vec![second.clone(), other.clone()],
        "releasing a stale claim leaves the current one alone"
    );
    assert!(claim_march(&store, &tbl, LONG).await.is_none());
    assert_eq!(store.switch_routes(&second, &[]).await.unwrap(), 0);

    let forged = CompactionClaim {
        owner_token: "forged".into(),
        ..second.clone()
    };
    assert_stale_compaction(
        store.renew_compaction(&forged, LONG).await,
        &forged,
        "a forged token",
    );
    store.release_compaction(&forged).await.unwrap();
    let newer = CompactionClaim {
        generation: second.generation + 1,
        ..second.clone()
    };
    assert_stale_compaction(
        store.renew_compaction(&newer, LONG).await,
        &newer,
        "a generation the window never had",
    );
    assert_eq!(store.compaction_claims().await.unwrap().len(), 2);

    store.release_compaction(&second).await.unwrap();
    store.release_compaction(&second).await.unwrap();
    assert_eq!(store.compaction_claims().await.unwrap(), vec![other]);
    let reason = assert_stale_compaction(
        store.renew_compaction(&second, LONG).await,
        &second,
        "renewing a released claim",
    );
    assert!(reason.contains("released"), "{reason}");
    let third = claim_march(&store, &tbl, LONG)
        .await
        .expect("a released window is claimable at once");
    assert_eq!(third.generation, 3);
}

/// The work list holds archived, cleaned buckets still routed to per-bucket objects: the
/// next due window is its first entry at or after a cursor when that bucket ended by the
/// cutoff; a window's partitions with work are listed in key order, paged; the sources of
/// some partitions are every archived, cleaned bucket they have in the window (segment
/// routes included), and a partition with any other bucket is named not ready.
pub async fn the_work_list_finds_due_windows_and_pages_their_partitions(store: Store) {
    let tbl = table(&store, "events", DAY).await;
    archived(
        &store,
        &tbl,
        "a",
        "2024-03-01T10:00:00Z",
        "t/a/1/m.json",
        true,
    )
    .await;
    let b1 = archived(
        &store,
        &tbl,
        "b",
        "2024-03-01T11:00:00Z",
        "t/b/1/m.json",
        true,
    )
    .await;
    archived(
        &store,
        &tbl,
        "a",
        "2024-03-02T10:00:00Z",
        "t/a/2/m.json",
        false,
    )
    .await;
    hot(&store, &tbl, "a", "2024-03-03T10:00:00Z").await;
    let seg = "t/segments/month:2024-03/s00062-g1/manifest.json";
    let b4 = archived(&store, &tbl, "b", "2024-03-04T10:00:00Z", seg, true).await;
    // A partition whose every bucket is in a segment has no work.
    let d8 = archived(&store, &tbl, "d", "2024-03-08T10:00:00Z", seg, true).await;
    // LIKE is case-sensitive on both stores: this key is not a segment's.
    let upper = "t/SEGMENTS/c/5/m.json";
    let c5 = archived(&store, &tbl, "c", "2024-03-05T10:00:00Z", upper, true).await;
    let a6 = hot(&store, &tbl, "a", "2024-03-06T10:00:00Z").await;
    store.claim(&a6, LONG).await.unwrap().expect("archiving");
    let a_apr = archived(
        &store,
        &tbl,
        "a",
        "2024-04-01T10:00:00Z",
        "t/a/apr/m.json",
        true,
    )
    .await;
    let other = tid("other");
    store
        .register_table(&pulpitum::store::TableDefinition::new(
            other.clone(),
            DAY,
            "raw",
        ))
        .await
        .unwrap();
    archived(
        &store,
        &other,
        "a",
        "2024-03-07T10:00:00Z",
        "o/a/7/m.json",
        true,
    )
    .await;

    let d = |s: &str| t(&format!("{s}T00:00:00Z"));
    let min = pulpitum::model::EventTime::min_supported();
    let next = |tbl: TableId, from: pulpitum::model::EventTime, before: &str| {
        let store = store.clone();
        let before = t(before);
        async move {
            store
                .next_compaction_start(&tbl, from, before)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        next(tbl.clone(), min, "2024-04-01T00:00:00Z").await,
        Some(d("2024-03-01"))
    );
    let just_after =
        |s: &str| pulpitum::model::EventTime::from_micros(d(s).as_micros() + 1).unwrap();
    assert_eq!(
        next(
            tbl.clone(),
            just_after("2024-03-01"),
            "2024-04-01T00:00:00Z"
        )
        .await,
        Some(d("2024-03-05")),
        "not cleaned, hot, segment-routed buckets are not work; a key that differs from a \
         segment's only in case is"
    );
    assert_eq!(
        next(tbl.clone(), d("2024-03-06"), "2024-04-01T00:00:00Z").await,
        None,
        "April's bucket ends after the cutoff"
    );
    assert_eq!(
        next(tbl.clone(), d("2024-03-06"), "2024-05-01T00:00:00Z").await,
        Some(d("2024-04-01"))
    );
    assert_eq!(
        next(tbl.clone(), min, "2024-03-01T23:59:59Z").await,
        None,
        "a bucket is due once it ended by the cutoff"
    );
    assert_eq!(
        next(tbl.clone(), min, "2024-03-02T00:00:00Z").await,
        Some(d("2024-03-01")),
        "bucket_end <= before"
    );
    assert_eq!(
        next(
            tbl.clone(),
            just_after("2024-04-01"),
            "2025-01-01T00:00:00Z"
        )
        .await,
        None
    );
    assert_eq!(
        next(other.clone(), min, "2025-01-01T00:00:00Z").await,
        Some(d("2024-03-07")),
        "tables are apart"
    );

    let pk = |p: &str| pulpitum::model::PartitionKey::new(p.as_bytes().to_vec()).unwrap();
    let (mar, apr, may) = (d("2024-03-01"), d("2024-04-01"), d("2024-05-01"));
    let parts = |after: Option<&str>, limit: usize, start, end| {
        let store = store.clone();
        let tbl = tbl.clone();
        let after = after.map(pk);
        async move {
            store
                .partitions_to_compact(&tbl, start, end, after.as_ref(), limit, true)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        parts(None, 100, mar, apr).await,
        [pk("a"), pk("b"), pk("c")],
        "d's only bucket is in a segment"
    );
    assert_eq!(parts(None, 2, mar, apr).await, [pk("a"), pk("b")]);
    assert_eq!(parts(Some("a"), 1, mar, apr).await, [pk("b")]);
    assert_eq!(parts(Some("c"), 100, mar, apr).await, []);
    assert_eq!(parts(None, 0, mar, apr).await, []);
    assert_eq!(parts(None, 100, apr, may).await, [pk("a")]);

    let source = |b: &BucketId, key: &str| CompactionSource {
        bucket: b.clone(),
        bucket_start: b.bucket_key.start(),
        bucket_end: b.bucket_key.end(),
        object_key: key.into(),
        masked: false,
    };
    let state = store
        .partition_sources(&tbl, mar, apr, &[pk("a"), pk("b"), pk("c"), pk("d")])
        .await
        .unwrap();
    assert_eq!(
        state.sources,
        vec![
            source(&b1, "t/b/1/m.json"),
            source(&b4, seg),
            source(&c5, upper),
            source(&d8, seg),
        ],
        "a is not ready; the others' buckets, segment routes included, by partition and start"
    );
    assert_eq!(state.not_ready, [pk("a")]);
    assert_eq!(state.sources[0].bucket_end, d("2024-03-02"));
    let april = store
        .partition_sources(&tbl, apr, may, &[pk("a")])
        .await
        .unwrap();
    assert_eq!(april.sources, vec![source(&a_apr, "t/a/apr/m.json")]);
    assert!(april.not_ready.is_empty());
    let only_b = store
        .partition_sources(&tbl, mar, apr, &[pk("b")])
        .await
        .unwrap();
    assert_eq!(only_b.sources.len(), 2, "only the partitions asked for");
    let empty = store
        .partition_sources(&tbl, d("2023-01-01"), d("2023-02-01"), &[pk("a")])
        .await
        .unwrap();
    assert_eq!(empty, Default::default());
    assert_eq!(
        store.partition_sources(&tbl, mar, apr, &[]).await.unwrap(),
        Default::default()
    );
}

/// A switch moves every route to its segment, reads follow the new route, the replaced
/// keys are retired at the store's time (a key replaced again takes the later time), and
/// forgetting retired keys deletes exactly their rows.
pub async fn switch_moves_every_route_and_retires_the_sources(store: Store) {
    let tbl = table(&store, "events", DAY).await;
    let a1 = archived(
        &store,
        &tbl,
        "a",
        "2024-03-01T10:00:00Z",
        "t/a/1/m.json",
        true,
    )
    .await;
    let b1 = archived(
        &store,
        &tbl,
        "b",
        "2024-03-01T11:00:00Z",
        "t/b/1/m.json",
        true,
    )
    .await;
    let a2 = archived(
        &store,
        &tbl,
        "a",
        "2024-03-02T10:00:00Z",
        "t/a/2/m.json",
        true,
    )
    .await;
    let s1 = "t/segments/month:2024-03/s00061-g1/manifest.json";
    let s2 = "t/segments/month:2024-03/s00062-g1/manifest.json";
    let claim = claim_march(&store, &tbl, LONG).await.unwrap();
    let before = store.now().await.unwrap();
    let n = store
        .switch_routes(
            &claim,
            &[
                switch(&a1, "t/a/1/m.json", s1),
                switch(&a2, "t/a/2/m.json", s1),
                switch(&b1, "t/b/1/m.json", s2),
            ],
        )
        .await
        .unwrap();
    let after = store.now().await.unwrap();
    assert_eq!(n, 3);
    let archived_to = |k: &str| BucketState::Archived {
        object_key: k.into(),
        hot_deleted: true,
    };
    assert_eq!(
        routes(&store, &tbl).await,
        vec![
            (a1.clone(), archived_to(s1)),
            (a2.clone(), archived_to(s1)),
            (b1.clone(), archived_to(s2)),
        ]
    );
    let page = store
        .read_page(
            &a2,
            &PageRequest {
                bounds: pulpitum::model::ScanBounds::all(),
                descending: false,
                limit: 10,
                include_value: true,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        page,
        HotPage::Archived {
            object_key: s1.into()
        }
    );
    assert_eq!(
        store.referenced_object_keys().await.unwrap(),
        vec![s1.to_string(), s2.to_string()]
    );
    let retired = store.retired_objects().await.unwrap();
    assert_eq!(
        retired_keys(&retired),
        ["t/a/1/m.json", "t/a/2/m.json", "t/b/1/m.json"]
    );
    for r in &retired {
        assert!(
            before <= r.retired_at && r.retired_at <= after,
            "retired at the store's time: {r:?} not in [{before}, {after}]"
        );
    }
    assert_eq!(
        store
            .next_compaction_start(
                &tbl,
                pulpitum::model::EventTime::min_supported(),
                t("2024-05-01T00:00:00Z")
            )
            .await
            .unwrap(),
        None,
        "switched buckets are no work any more"
    );
    let pk = |p: &str| pulpitum::model::PartitionKey::new(p.as_bytes().to_vec()).unwrap();
    let state = store
        .partition_sources(
            &tbl,
            t("2024-03-01T00:00:00Z"),
            t("2024-04-01T00:00:00Z"),
            &[pk("a"), pk("b")],
        )
        .await
        .unwrap();
    assert_eq!(
        state
            .sources
            .iter()
            .map(|s| s.object_key.as_str())
            .collect::<Vec<_>>(),
        [s1, s1, s2]
    );

    // A later compaction of the window replaces s1 in two switches: its retirement is the
    // later one, since readers may have held a route to s1 until then.
    let s3 = "t/segments/month:2024-03/s00061-g2/manifest.json";
    assert_eq!(
        store
            .switch_routes(&claim, &[switch(&a1, s1, s3)])
            .await
            .unwrap(),
        1
    );
    let first_retired = store.retired_objects().await.unwrap();
    let at = |list: &[pulpitum::store::RetiredObject], k: &str| {
        list.iter()
            .find(|r| r.object_key == k)
            .map(|r| r.retired_at)
            .expect("retired")
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        store
            .switch_routes(&claim, &[switch(&a2, s1, s3)])
            .await
            .unwrap(),
        1
    );
    let again = store.retired_objects().await.unwrap();
    assert!(
        at(&again, s1) > at(&first_retired, s1),
        "retired again later: {:?} then {:?}",
        at(&first_retired, s1),
        at(&again, s1)
    );
    assert_eq!(
        at(&again, "t/a/1/m.json"),
        at(&first_retired, "t/a/1/m.json")
    );
    assert_eq!(store.switch_routes(&claim, &[]).await.unwrap(), 0);
    assert_eq!(store.retired_objects().await.unwrap(), again);

    assert_eq!(store.forget_retired(&[]).await.unwrap(), 0);
    assert_eq!(
        store
            .forget_retired(&["t/a/1/m.json".into(), "never/retired".into(), s1.into()])
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        retired_keys(&store.retired_objects().await.unwrap()),
        ["t/a/2/m.json", "t/b/1/m.json"]
    );
    store.release_compaction(&claim).await.unwrap();
    assert!(store.compaction_claims().await.unwrap().is_empty());
}

/// A switch is refused, writing nothing, when any bucket's route is not the one the
/// compaction read (another object, not cleaned, not archived, no bucket at all), when a
/// bucket is outside the claimed window or listed twice, and when the claim is stale
/// (forged, superseded, released or expired); the first bucket that differs is named.
pub async fn refused_switches_write_nothing(store: Store) {
    let tbl = table(&store, "events", DAY).await;
    let a = archived(
        &store,
        &tbl,
        "a",
        "2024-03-01T10:00:00Z",
        "t/a/1/m.json",
        true,
    )
    .await;
    let b = archived(
        &store,
        &tbl,
        "b",
        "2024-03-01T11:00:00Z",
        "t/b/1/m.json",
        true,
    )
    .await;
    let c = archived(
        &store,
        &tbl,
        "c",
        "2024-03-01T12:00:00Z",
        "t/c/1/m.json",
        false,
    )
    .await;
    let d = hot(&store, &tbl, "d", "2024-03-01T13:00:00Z").await;
    let apr = archived(
        &store,
        &tbl,
        "a",
        "2024-04-01T10:00:00Z",
        "t/a/apr/m.json",
        true,
    )
    .await;
    let missing = bucket_of(&tbl, DAY, &rec("e", t("2024-03-01T10:00:00Z"), b"k", b"v"));
    let seg = "t/segments/month:2024-03/s00061-g1/manifest.json";
    let ok_a = switch(&a, "t/a/1/m.json", seg);
    let ok_b = switch(&b, "t/b/1/m.json", seg);
    let claim = claim_march(&store, &tbl, LONG).await.unwrap();
    let untouched = routes(&store, &tbl).await;
    let nothing_written = |what: &'static str| {
        let store = store.clone();
        let tbl = tbl.clone();
        let untouched = untouched.clone();
        async move {
            assert_eq!(
                routes(&store, &tbl).await,
                untouched,
                "{what}: routes changed"
            );
            assert!(
                store.retired_objects().await.unwrap().is_empty(),
                "{what}: keys were retired"
            );
        }
    };

    let reason = assert_route_changed(
        store
            .switch_routes(&claim, &[ok_a.clone(), switch(&b, "t/b/OTHER/m.json", seg)])
            .await,
        &b,
        "another object",
    );
    assert!(reason.contains("t/b/1/m.json"), "{reason}");
    nothing_written("another object").await;
    let reason = assert_route_changed(
        store
            .switch_routes(&claim, &[ok_a.clone(), switch(&c, "t/c/1/m.json", seg)])
            .await,
        &c,
        "hot rows not deleted",
    );
    assert!(reason.contains("not deleted"), "{reason}");
    nothing_written("hot rows not deleted").await;
    let reason = assert_route_changed(
        store
            .switch_routes(&claim, &[ok_a.clone(), switch(&d, "t/d/1/m.json", seg)])
            .await,
        &d,
        "a hot bucket",
    );
    assert!(reason.contains("hot"), "{reason}");
    nothing_written("a hot bucket").await;
    assert_route_changed(
        store
            .switch_routes(
                &claim,
                &[ok_a.clone(), switch(&missing, "t/e/1/m.json", seg)],
            )
            .await,
        &missing,
        "no bucket",
    );
    nothing_written("no bucket").await;
    assert_route_changed(
        store
            .switch_routes(
                &claim,
                &[
                    ok_a.clone(),
                    switch(&b, "t/b/OTHER/m.json", seg),
                    switch(&c, "t/c/1/m.json", seg),
                ],
            )
            .await,
        &b,
        "two buckets differ",
    );
    nothing_written("two buckets differ").await;
    assert_route_changed(
        store
            .switch_routes(&claim, &[ok_a.clone(), switch(&apr, "t/a/apr/m.json", seg)])
            .await,
        &apr,
        "outside the window",
    );
    nothing_written("outside the window").await;
    assert_route_changed(
        store
            .switch_routes(&claim, &[ok_a.clone(), ok_b.clone(), ok_a.clone()])
            .await,
        &a,
        "listed twice",
    );
    nothing_written("listed twice").await;

    let forged = CompactionClaim {
        owner_token: "forged".into(),
        ..claim.clone()
    };
    assert_stale_compaction(
        store
            .switch_routes(&forged, &[ok_a.clone(), ok_b.clone()])
            .await,
        &forged,
        "a forged token",
    );
    nothing_written("a forged token").await;
    let older = CompactionClaim {
        generation: 0,
        ..claim.clone()
    };
    assert_stale_compaction(
        store
            .switch_routes(&older, &[ok_a.clone(), ok_b.clone()])
            .await,
        &older,
        "another generation",
    );
    nothing_written("another generation").await;
    store.release_compaction(&claim).await.unwrap();
    assert_stale_compaction(
        store
            .switch_routes(&claim, &[ok_a.clone(), ok_b.clone()])
            .await,
        &claim,
        "a released claim",
    );
    nothing_written("a released claim").await;
    let short = claim_march(&store, &tbl, SHORT).await.unwrap();
    tokio::time::sleep(PAST_SHORT).await;
    let reason = assert_stale_compaction(
        store
            .switch_routes(&short, &[ok_a.clone(), ok_b.clone()])
            .await,
        &short,
        "an expired lease",
    );
    assert!(reason.contains("expired"), "{reason}");
    nothing_written("an expired lease").await;

    // The same switch under a current claim goes through: the refusals above were theirs.
    let current = claim_march(&store, &tbl, LONG).await.unwrap();
    assert_eq!(current.generation, short.generation + 1);
    assert_eq!(
        store.switch_routes(&current, &[ok_a, ok_b]).await.unwrap(),
        2
    );
    assert_eq!(
        retired_keys(&store.retired_objects().await.unwrap()),
        ["t/a/1/m.json", "t/b/1/m.json"]
    );
    assert!(store.bucket(&c).await.unwrap().is_some_and(|m| m.state
        == BucketState::Archived {
            object_key: "t/c/1/m.json".into(),
            hot_deleted: false
        }));
}

/// Dropping an empty archived bucket under a window claim: refused (writing nothing) for a
/// stale claim, a bucket outside the window, a route that is not the source read, and a
/// bucket whose hot rows are not deleted; otherwise its route goes (it reads as missing),
/// its object is retired, and the other buckets are untouched.
pub async fn empty_buckets_are_dropped_under_the_claim(store: Store) {
    let tbl = table(&store, "events", DAY).await;
    let a = archived(
        &store,
        &tbl,
        "a",
        "2024-03-01T10:00:00Z",
        "t/a/1/m.json",
        true,
    )
    .await;
    let b = archived(
        &store,
        &tbl,
        "b",
        "2024-03-02T10:00:00Z",
        "t/b/2/m.json",
        true,
    )
    .await;
    let c = archived(
        &store,
        &tbl,
        "c",
        "2024-03-03T10:00:00Z",
        "t/c/3/m.json",
        false,
    )
    .await;
    let apr = archived(
        &store,
        &tbl,
        "a",
        "2024-04-01T10:00:00Z",
        "t/a/apr/m.json",
        true,
    )
    .await;
    let source = |bucket: &BucketId, key: &str| CompactionSource {
        bucket: bucket.clone(),
        bucket_start: bucket.bucket_key.start(),
        bucket_end: bucket.bucket_key.end(),
        object_key: key.into(),
        masked: false,
    };
    let stale = claim_march(&store, &tbl, SHORT).await.unwrap();
    tokio::time::sleep(PAST_SHORT).await;
    let claim = claim_march(&store, &tbl, LONG).await.unwrap();
    let untouched = routes(&store, &tbl).await;
    let nothing_written = |what: &'static str| {
        let store = store.clone();
        let tbl = tbl.clone();
        let untouched = untouched.clone();
        async move {
            assert_eq!(
                routes(&store, &tbl).await,
                untouched,
                "{what}: routes changed"
            );
            assert!(
                store.retired_objects().await.unwrap().is_empty(),
                "{what}: keys were retired"
            );
        }
    };
    assert_stale_compaction(
        store
            .drop_empty_buckets(&stale, &[source(&a, "t/a/1/m.json")])
            .await,
        &stale,
        "a stale claim",
    );
    nothing_written("a stale claim").await;
    assert_route_changed(
        store
            .drop_empty_buckets(&claim, &[source(&apr, "t/a/apr/m.json")])
            .await,
        &apr,
        "outside the window",
    );
    nothing_written("outside the window").await;
    let reason = assert_route_changed(
        store
            .drop_empty_buckets(
                &claim,
                &[source(&a, "t/a/1/m.json"), source(&b, "t/b/OTHER/m.json")],
            )
            .await,
        &b,
        "another object",
    );
    assert!(reason.contains("t/b/2/m.json"), "{reason}");
    nothing_written("another object").await;
    assert_route_changed(
        store
            .drop_empty_buckets(&claim, &[source(&c, "t/c/3/m.json")])
            .await,
        &c,
        "hot rows not deleted",
    );
    nothing_written("hot rows not deleted").await;

    let dropped = store
        .drop_empty_buckets(&claim, &[source(&a, "t/a/1/m.json")])
        .await
        .unwrap();
    assert_eq!(dropped, 1);
    assert_eq!(
        retired_keys(&store.retired_objects().await.unwrap()),
        ["t/a/1/m.json"]
    );
    let left: Vec<BucketId> = routes(&store, &tbl)
        .await
        .into_iter()
        .map(|(b, _)| b)
        .collect();
    assert!(!left.contains(&a), "{left:?}");
    for other in [&b, &c, &apr] {
        assert!(left.contains(other), "{other} was dropped too");
    }
    let page = store
        .read_page(
            &a,
            &PageRequest {
                bounds: pulpitum::model::ScanBounds::all(),
                descending: false,
                limit: 10,
                include_value: true,
            },
        )
        .await
        .unwrap();
    assert!(matches!(page, HotPage::Missing), "{page:?}");
}

/// Masks not yet rewritten are compaction work, due at once and only for their
/// partitions; marking them rewritten takes the route and each mask's kind and value into
/// account; readers still get marked masks until GC forgets them after its delay; a new
/// edit over a rewritten mask is work again.
pub async fn masks_are_work_until_a_rewrite_marks_them(store: Store) {
    use pulpitum::model::EventTime;
    use pulpitum::store::{RowChange, RowMask};
    let tbl = table(&store, "events", DAY).await;
    let seg = "t/segments/month:2024-03/s00000-g1/manifest.json";
    let a1 = archived(&store, &tbl, "a", "2024-03-01T10:00:00Z", seg, true).await;
    let b1 = archived(&store, &tbl, "b", "2024-03-01T11:00:00Z", seg, true).await;
    let (mar, apr) = (t("2024-03-01T00:00:00Z"), t("2024-04-01T00:00:00Z"));
    let long_ago = t("2000-01-01T00:00:00Z");
    let min = EventTime::min_supported();
    assert_eq!(
        store
            .next_compaction_start(&tbl, min, t("2025-01-01T00:00:00Z"))
            .await
            .unwrap(),
        None,
        "everything is in a segment"
    );
    let change = |p: &str, at: &str, old: &[u8], new: Option<&[u8]>| RowChange {
        partition_key: pulpitum::model::PartitionKey::new(p.as_bytes().to_vec()).unwrap(),
        event_time: t(at),
        sort_key: pulpitum::model::SortKey::new(b"k".to_vec()).unwrap(),
        old_value: old.to_vec(),
        new_value: new.map(<[u8]>::to_vec),
    };
    let read_at = store.now().await.unwrap();
    store
        .apply_changes(
            &tbl,
            read_at,
            &[change("a", "2024-03-01T10:00:00Z", b"v", None)],
        )
        .await
        .unwrap();
    store
        .apply_changes(
            &tbl,
            read_at,
            &[change("b", "2024-03-01T11:00:00Z", b"v", Some(b"w"))],
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .next_compaction_start(&tbl, min, long_ago)
            .await
            .unwrap(),
        Some(t("2024-03-01T00:00:00Z")),
        "masks are due at once, whatever the cutoff"
    );
    let pk = |p: &str| pulpitum::model::PartitionKey::new(p.as_bytes().to_vec()).unwrap();
    for due in [true, false] {
        assert_eq!(
            store
                .partitions_to_compact(&tbl, mar, apr, None, 10, due)
                .await
                .unwrap(),
            [pk("a"), pk("b")]
        );
    }
    let state = store
        .partition_sources(&tbl, mar, apr, &[pk("a"), pk("b")])
        .await
        .unwrap();
    assert!(state.sources.iter().all(|s| s.masked), "{state:?}");

    let masks_a = store.row_masks(&a1).await.unwrap();
    let masks_b = store.row_masks(&b1).await.unwrap();
    assert_eq!(masks_a.len(), 1);
    let other = "t/segments/month:2024-03/s00001-g2/manifest.json";
    assert_eq!(
        store.mark_masks_purged(&a1, other, &masks_a).await.unwrap(),
        0,
        "not while the bucket routes elsewhere"
    );
    let stale = vec![RowMask {
        value: Some(b"old".to_vec()),
        ..masks_b[0].clone()
    }];
    assert_eq!(
        store.mark_masks_purged(&b1, seg, &stale).await.unwrap(),
        0,
        "not a mask that changed since the rewrite read it"
    );
    assert_eq!(
        store.mark_masks_purged(&a1, seg, &masks_a).await.unwrap(),
        1
    );
    assert_eq!(
        store.mark_masks_purged(&a1, seg, &masks_a).await.unwrap(),
        0,
        "marked once"
    );
    assert_eq!(
        store.mark_masks_purged(&b1, seg, &masks_b).await.unwrap(),
        1
    );
    assert_eq!(
        store
            .next_compaction_start(&tbl, min, long_ago)
            .await
            .unwrap(),
        None,
        "rewritten masks are no work"
    );
    assert!(store
        .partitions_to_compact(&tbl, mar, apr, None, 10, false)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        store.row_masks(&a1).await.unwrap(),
        masks_a,
        "readers still apply it"
    );

    // A new edit over the rewritten one is work again, and is kept by GC.
    let read_at = store.now().await.unwrap();
    store
        .apply_changes(
            &tbl,
            read_at,
            &[change("b", "2024-03-01T11:00:00Z", b"w", Some(b"x"))],
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .partitions_to_compact(&tbl, mar, apr, None, 10, false)
            .await
            .unwrap(),
        [pk("b")]
    );
    assert_eq!(
        store
            .forget_purged_masks(Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        0,
        "inside the delay"
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        store
            .forget_purged_masks(Duration::ZERO, 100)
            .await
            .unwrap(),
        1,
        "a's mask; b's was edited again"
    );
    assert!(store.row_masks(&a1).await.unwrap().is_empty());
    assert_eq!(
        store.row_masks(&b1).await.unwrap()[0].value.as_deref(),
        Some(&b"x"[..])
    );
}

/// A bucket removed with masks (every row deleted and dropped by a rewrite, or past
/// retention) keeps them, marked rewritten, for readers still on its old route; a bucket
/// created again under the same key by a late append does not inherit them: its re-inserted
/// row is not hidden, and a change of it is checked and masked afresh.
/// The days the mask cases use: partition `a` archived on days 1, 2, 3 and 11 of March
/// 2024 (one row each, at 10:00), partition `b` on day 2.
async fn four_days_and_a_neighbour(
    store: &Store,
    tbl: &TableId,
) -> ([&'static str; 4], Vec<BucketId>, BucketId) {
    let days = [
        "2024-03-01T10:00:00Z",
        "2024-03-02T10:00:00Z",
        "2024-03-03T10:00:00Z",
        "2024-03-11T10:00:00Z",
    ];
    let mut a = Vec::new();
    for (i, at) in days.iter().enumerate() {
        a.push(archived(store, tbl, "a", at, &format!("t/a/{i}/m.json"), true).await);
    }
    let b = archived(store, tbl, "b", days[1], "t/b/1/m.json", true).await;
    (days, a, b)
}

/// `row_masks_of` (a run's masks in one statement) gives exactly the masks `row_masks` gives
/// for each named bucket: none of a bucket between them it does not name, of another
/// partition, or of a bucket created again since its mask.
pub async fn the_masks_of_several_buckets_are_each_buckets_own(store: Store) {
    use pulpitum::model::{PartitionKey, SortKey};
    use pulpitum::store::RowChange;
    let tbl = table(&store, "events", DAY).await;
    let (days, a, b) = four_days_and_a_neighbour(&store, &tbl).await;
    let delete = |partition: &str, at: &str| RowChange {
        partition_key: PartitionKey::new(partition.as_bytes().to_vec()).unwrap(),
        event_time: t(at),
        sort_key: SortKey::new(b"k".to_vec()).unwrap(),
        old_value: b"v".to_vec(),
        new_value: None,
    };
    let read_at = store.now().await.unwrap();
    let changes: Vec<RowChange> = days
        .iter()
        .map(|at| delete("a", at))
        .chain([delete("b", days[1])])
        .collect();
    store.apply_changes(&tbl, read_at, &changes).await.unwrap();
    let pk = PartitionKey::new(b"a".to_vec()).unwrap();
    let of = |ids: &[&BucketId]| ids.iter().map(|b| b.bucket_key).collect::<Vec<_>>();
    let times = |masks: Vec<pulpitum::store::RowMask>| {
        let mut t: Vec<_> = masks.into_iter().map(|m| m.event_time).collect();
        t.sort();
        t
    };
    // Days 1 and 11, not 2 and 3 in between, nor partition b's day 2.
    let got = store
        .row_masks_of(&tbl, &pk, &of(&[&a[0], &a[3]]))
        .await
        .unwrap();
    assert_eq!(times(got), vec![t(days[0]), t(days[3])]);
    let all = store
        .row_masks_of(&tbl, &pk, &of(&[&a[0], &a[1], &a[2], &a[3]]))
        .await
        .unwrap();
    assert_eq!(times(all), days.iter().map(|d| t(d)).collect::<Vec<_>>());
    for bucket in a.iter().chain([&b]) {
        let one = store
            .row_masks_of(&bucket.table_id, &bucket.partition_key, &of(&[bucket]))
            .await
            .unwrap();
        assert_eq!(one, store.row_masks(bucket).await.unwrap(), "{bucket}");
        assert_eq!(one.len(), 1, "{bucket}");
    }
    assert!(store.row_masks_of(&tbl, &pk, &[]).await.unwrap().is_empty());
}

/// `buckets_with_deletes` names every bucket in the key range (any partition) that holds a
/// delete record and no other: not one with only an edit, not one outside the range, not
/// another table's; and it stops at its limit.
pub async fn the_buckets_with_deletes_are_exactly_those_with_delete_records(store: Store) {
    use pulpitum::model::{BucketKey, PartitionKey, SortKey};
    use pulpitum::store::RowChange;
    let tbl = table(&store, "events", DAY).await;
    let other = table(&store, "others", DAY).await;
    let (days, a, b) = four_days_and_a_neighbour(&store, &tbl).await;
    let o = archived(&store, &other, "a", days[2], "o/a/2/m.json", true).await;
    let change = |partition: &str, at: &str, new_value: Option<Vec<u8>>| RowChange {
        partition_key: PartitionKey::new(partition.as_bytes().to_vec()).unwrap(),
        event_time: t(at),
        sort_key: SortKey::new(b"k".to_vec()).unwrap(),
        old_value: b"v".to_vec(),
        new_value,
    };
    let read_at = store.now().await.unwrap();
    // Deletes on a's first and last days and b's day 2; an edit on a's day 2.
    let changes = [
        change("a", days[0], None),
        change("a", days[1], Some(b"edited".to_vec())),
        change("a", days[3], None),
        change("b", days[1], None),
    ];
    store.apply_changes(&tbl, read_at, &changes).await.unwrap();
    store
        .apply_changes(&other, read_at, &[change("a", days[2], None)])
        .await
        .unwrap();
    let key = |b: &BucketId| (b.partition_key.clone(), b.bucket_key);
    let ask = |first: BucketKey, last: BucketKey, limit: usize| {
        let (store, tbl) = (store.clone(), tbl.clone());
        async move {
            let mut got = store
                .buckets_with_deletes(&tbl, None, (&first, &last), limit)
                .await
                .unwrap()
                .expect("the store can tell");
            got.sort();
            got
        }
    };
    let mut want = vec![key(&a[0]), key(&a[3]), key(&b)];
    want.sort();
    assert_eq!(ask(a[0].bucket_key, a[3].bucket_key, 100).await, want);
    // Days 2 and 3 only: b's delete, not a's edit.
    assert_eq!(
        ask(a[1].bucket_key, a[2].bucket_key, 100).await,
        vec![key(&b)]
    );
    // The other table's delete on day 3 is not this table's.
    assert!(ask(a[2].bucket_key, a[2].bucket_key, 100).await.is_empty());
    assert_eq!(
        store
            .buckets_with_deletes(&other, None, (&o.bucket_key, &o.bucket_key), 100)
            .await
            .unwrap(),
        Some(vec![key(&o)])
    );
    assert_eq!(ask(a[0].bucket_key, a[3].bucket_key, 2).await.len(), 2);
    // Named partitions: only theirs.
    let only_b = store
        .buckets_with_deletes(
            &tbl,
            Some(std::slice::from_ref(&b.partition_key)),
            (&a[0].bucket_key, &a[3].bucket_key),
            100,
        )
        .await
        .unwrap();
    assert_eq!(only_b, Some(vec![key(&b)]));
    let mut both = store
        .buckets_with_deletes(
            &tbl,
            Some(&[a[0].partition_key.clone(), b.partition_key.clone()]),
            (&a[0].bucket_key, &a[3].bucket_key),
            100,
        )
        .await
        .unwrap()
        .unwrap();
    both.sort();
    assert_eq!(both, want);
}

pub async fn a_bucket_created_again_does_not_inherit_its_namesakes_masks(store: Store) {
    use pulpitum::store::RowChange;
    let tbl = table(&store, "events", DAY).await;
    let at = "2024-03-01T10:00:00Z";
    let key = "t/a/1/m.json";
    let a = archived(&store, &tbl, "a", at, key, true).await;
    let change = |old: &[u8], new: Option<&[u8]>| RowChange {
        partition_key: pulpitum::model::PartitionKey::new(b"a".to_vec()).unwrap(),
        event_time: t(at),
        sort_key: pulpitum::model::SortKey::new(b"k".to_vec()).unwrap(),
        old_value: old.to_vec(),
        new_value: new.map(<[u8]>::to_vec),
    };
    let read_at = store.now().await.unwrap();
    store
        .apply_changes(&tbl, read_at, &[change(b"v", None)])
        .await
        .unwrap();
    // The rewrite finds the bucket empty and drops it: the mask stays for old routes.
    let claim = claim_march(&store, &tbl, LONG).await.unwrap();
    let source = CompactionSource {
        bucket: a.clone(),
        bucket_start: a.bucket_key.start(),
        bucket_end: a.bucket_key.end(),
        object_key: key.into(),
        masked: true,
    };
    assert_eq!(
        store.drop_empty_buckets(&claim, &[source]).await.unwrap(),
        1
    );
    assert_eq!(
        store.row_masks(&a).await.unwrap().len(),
        1,
        "kept for old routes"
    );
    let min = pulpitum::model::EventTime::min_supported();
    assert_eq!(
        store.next_compaction_start(&tbl, min, min).await.unwrap(),
        None,
        "marked: no work"
    );

    // A late append creates the bucket again, with the same row.
    tokio::time::sleep(Duration::from_millis(5)).await;
    store
        .append(&tbl, &rec("a", t(at), b"k", b"again"))
        .await
        .unwrap();
    assert!(
        store.row_masks(&a).await.unwrap().is_empty(),
        "the new bucket does not inherit the old mask"
    );
    assert!(
        store
            .row_masks_of(&tbl, &a.partition_key, &[a.bucket_key])
            .await
            .unwrap()
            .is_empty(),
        "nor does a run of it"
    );
    // Archived again (a new object), its row is changed afresh: the old mask neither
    // refuses the change nor survives it.
    let claim = store.claim(&a, LONG).await.unwrap().expect("archive claim");
    store
        .publish_archive(&claim, "t/a/1b/m.json")
        .await
        .unwrap();
    let read_at = store.now().await.unwrap();
    store
        .apply_changes(&tbl, read_at, &[change(b"again", Some(b"edited"))])
        .await
        .unwrap();
    let masks = store.row_masks(&a).await.unwrap();
    assert_eq!(masks.len(), 1);
    assert_eq!(masks[0].value.as_deref(), Some(&b"edited"[..]));

    // Retention keeps masks the same way (marked, for old routes).
    let cleaner = store
        .claim_cleanup(&a, LONG)
        .await
        .unwrap()
        .expect("cleanup");
    while !store
        .cleanup_step(&cleaner, 100, Duration::ZERO)
        .await
        .unwrap()
        .1
    {}
    let expired = store
        .expire_bucket(&a, t("2025-01-01T00:00:00Z"))
        .await
        .unwrap();
    assert!(expired.is_some());
    assert_eq!(
        store.row_masks(&a).await.unwrap().len(),
        1,
        "kept for old routes"
    );
    assert_eq!(
        store.next_compaction_start(&tbl, min, min).await.unwrap(),
        None,
        "marked: no work"
    );
    assert_eq!(
        store.forget_purged_masks(Duration::ZERO, 10).await.unwrap(),
        1
    );
}

/// A segment some partitions left (a rewrite retired it) is work for the partitions still
/// routed to it, due at once, until they move too; retention, which removes buckets one by
/// one, retires a shared segment only with its last bucket (or at once when the removed
/// bucket had deletes not yet rewritten), and two removals of a segment's last two buckets
/// at once still retire it, once (a race only PostgreSQL can run: SQLite serializes
/// writers).
pub async fn routes_to_a_retired_segment_are_work_and_its_last_bucket_retires_it(store: Store) {
    let tbl = table(&store, "events", DAY).await;
    let s1 = "t/segments/month:2024-03/s00000-g1/manifest.json";
    let s2 = "t/segments/month:2024-03/s00000-g2/manifest.json";
    let a = archived(&store, &tbl, "a", "2024-03-01T10:00:00Z", s1, true).await;
    let b = archived(&store, &tbl, "b", "2024-03-02T10:00:00Z", s1, true).await;
    let min = pulpitum::model::EventTime::min_supported();
    let far = t("2030-01-01T00:00:00Z");
    assert_eq!(
        store.next_compaction_start(&tbl, min, far).await.unwrap(),
        None,
        "both in a live segment: no work"
    );
    // A rewrite moves partition a: s1 is retired while b still routes to it.
    let claim = claim_march(&store, &tbl, LONG).await.unwrap();
    store
        .switch_routes(&claim, &[switch(&a, s1, s2)])
        .await
        .unwrap();
    assert!(retired_keys(&store.retired_objects().await.unwrap()).contains(&s1.to_string()));
    assert_eq!(
        store.next_compaction_start(&tbl, min, min).await.unwrap(),
        Some(t("2024-03-02T00:00:00Z")),
        "b's bucket, due at once whatever the cutoff"
    );
    let (start, end) = (t("2024-03-01T00:00:00Z"), t("2024-04-01T00:00:00Z"));
    let pb = pulpitum::model::PartitionKey::new(b"b".to_vec()).unwrap();
    assert_eq!(
        store
            .partitions_to_compact(&tbl, start, end, None, 10, false)
            .await
            .unwrap(),
        vec![pb.clone()],
        "only b: a routes to the new segment"
    );
    assert!(store
        .partitions_to_compact(&tbl, start, end, Some(&pb), 10, false)
        .await
        .unwrap()
        .is_empty());
    let retired_at = |list: Vec<pulpitum::store::RetiredObject>, key: &str| {
        list.into_iter()
            .find(|r| r.object_key == key)
            .map(|r| r.retired_at)
    };
    let first_retired = retired_at(store.retired_objects().await.unwrap(), s1).unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    store
        .switch_routes(&claim, &[switch(&b, s1, s2)])
        .await
        .unwrap();
    assert_eq!(
        store.next_compaction_start(&tbl, min, min).await.unwrap(),
        None,
        "nothing routes to s1 any more"
    );
    let last_retired = retired_at(store.retired_objects().await.unwrap(), s1).unwrap();
    assert!(
        last_retired > first_retired,
        "the retirement delay runs from the last route that left: {first_retired} then \
         {last_retired}"
    );
    store.release_compaction(&claim).await.unwrap();

    // Retention: three buckets in s2 now (a, b, and c below); the first two removed leave
    // it unretired, the last retires it.
    let c = archived(&store, &tbl, "c", "2024-03-03T10:00:00Z", s2, true).await;
    store.forget_retired(&[s1.to_string()]).await.unwrap();
    let cutoff = t("2025-01-01T00:00:00Z");
    for (bucket, last) in [(&a, false), (&b, false), (&c, true)] {
        let done = store.expire_bucket(bucket, cutoff).await.unwrap().unwrap();
        assert_eq!(done.retired, last, "{bucket}");
        assert_eq!(
            retired_keys(&store.retired_objects().await.unwrap()),
            if last {
                vec![s2.to_string()]
            } else {
                Vec::new()
            },
            "after {bucket}"
        );
    }
    store.forget_retired(&[s2.to_string()]).await.unwrap();

    // A bucket removed with a delete not yet rewritten retires its shared segment at once:
    // the deleted row's bytes are in it, and the buckets left on it become work.
    let s3 = "t/segments/month:2024-04/s00000-g1/manifest.json";
    let d = archived(&store, &tbl, "d", "2024-04-01T10:00:00Z", s3, true).await;
    let e = archived(&store, &tbl, "e", "2024-04-02T10:00:00Z", s3, true).await;
    delete_row(&store, &tbl, &d, "2024-04-01T10:00:00Z").await;
    let done = store.expire_bucket(&d, cutoff).await.unwrap().unwrap();
    assert!(done.retired, "retired with its unrewritten delete");
    assert_eq!(
        retired_keys(&store.retired_objects().await.unwrap()),
        vec![s3.to_string()]
    );
    assert_eq!(
        store.next_compaction_start(&tbl, min, min).await.unwrap(),
        Some(t("2024-04-02T00:00:00Z")),
        "e must leave the segment"
    );
    store.expire_bucket(&e, cutoff).await.unwrap().unwrap();
    store.forget_retired(&[s3.to_string()]).await.unwrap();

    // The last two buckets of a segment removed at once, many times over: every segment
    // ends retired.
    let mut pairs = Vec::new();
    for i in 0..8 {
        let key = format!("t/segments/month:2024-05/s{i:05}-g1/manifest.json");
        let x = archived(
            &store,
            &tbl,
            &format!("x{i}"),
            "2024-05-01T10:00:00Z",
            &key,
            true,
        )
        .await;
        let y = archived(
            &store,
            &tbl,
            &format!("y{i}"),
            "2024-05-02T10:00:00Z",
            &key,
            true,
        )
        .await;
        pairs.push((key, x, y));
    }
    let mut tasks = Vec::new();
    for (_, x, y) in &pairs {
        for bucket in [x.clone(), y.clone()] {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                store
                    .expire_bucket(&bucket, cutoff)
                    .await
                    .unwrap()
                    .unwrap()
                    .retired
            }));
        }
    }
    let mut retired_by = 0;
    for task in tasks {
        retired_by += usize::from(task.await.unwrap());
    }
    let mut want: Vec<String> = pairs.iter().map(|(k, _, _)| k.clone()).collect();
    want.sort();
    assert_eq!(retired_keys(&store.retired_objects().await.unwrap()), want);
    assert_eq!(
        retired_by,
        pairs.len(),
        "each segment retired by one removal"
    );
}

/// A partition with a bucket not ready (hot) is named not ready; its ready buckets are
/// sources only while one of them has masks not yet rewritten or routes to a retired
/// object (work due at once), never its hot bucket.
pub async fn a_busy_partition_offers_its_ready_buckets_only_for_work_due_at_once(store: Store) {
    let tbl = table(&store, "events", DAY).await;
    let (start, end) = (t("2024-03-01T00:00:00Z"), t("2024-04-01T00:00:00Z"));
    let pa = pulpitum::model::PartitionKey::new(b"a".to_vec()).unwrap();
    let day1 = archived(
        &store,
        &tbl,
        "a",
        "2024-03-01T10:00:00Z",
        "t/a/1/m.json",
        true,
    )
    .await;
    // Day 2 routes to a segment it shares with a February bucket of another partition.
    let shared = "t/segments/month:2024-03/s00001-g1/manifest.json";
    let day2 = archived(&store, &tbl, "a", "2024-03-02T10:00:00Z", shared, true).await;
    hot(&store, &tbl, "a", "2024-03-20T10:00:00Z").await;
    let sources = |w: &pulpitum::store::WindowState| -> Vec<BucketId> {
        w.sources.iter().map(|s| s.bucket.clone()).collect()
    };
    let w = store
        .partition_sources(&tbl, start, end, std::slice::from_ref(&pa))
        .await
        .unwrap();
    assert_eq!(w.not_ready, vec![pa.clone()]);
    assert!(w.sources.is_empty(), "nothing due at once: {w:?}");

    // A delete of day 1's row: both ready days are sources, day 1 masked; the hot day not.
    delete_row(&store, &tbl, &day1, "2024-03-01T10:00:00Z").await;
    let w = store
        .partition_sources(&tbl, start, end, std::slice::from_ref(&pa))
        .await
        .unwrap();
    assert_eq!(w.not_ready, vec![pa.clone()]);
    assert_eq!(sources(&w), vec![day1.clone(), day2.clone()]);
    assert_eq!(
        w.sources.iter().map(|s| s.masked).collect::<Vec<_>>(),
        vec![true, false]
    );

    // The mask rewritten (day 1 switched to a segment, the mask marked): nothing due.
    let seg = "t/segments/month:2024-03/s00000-g1/manifest.json";
    let claim = claim_march(&store, &tbl, LONG).await.unwrap();
    store
        .switch_routes(&claim, &[switch(&day1, "t/a/1/m.json", seg)])
        .await
        .unwrap();
    let masks = store.row_masks(&day1).await.unwrap();
    assert_eq!(
        store.mark_masks_purged(&day1, seg, &masks).await.unwrap(),
        1
    );
    let w = store
        .partition_sources(&tbl, start, end, std::slice::from_ref(&pa))
        .await
        .unwrap();
    assert!(w.sources.is_empty(), "{w:?}");

    // Day 2's segment retired while it still routes there (the other partition moved):
    // due at once again. A retired per-bucket object (day 1's) is not such work: only a
    // segment is shared.
    let claim2 = store
        .claim_compaction(
            &tbl,
            "month:2024-02",
            t("2024-02-01T00:00:00Z"),
            t("2024-03-01T00:00:00Z"),
            LONG,
        )
        .await
        .unwrap()
        .unwrap();
    let other = archived(&store, &tbl, "b", "2024-02-10T10:00:00Z", shared, true).await;
    store
        .switch_routes(&claim2, &[switch(&other, shared, "t/b/seg.json")])
        .await
        .unwrap();
    let w = store
        .partition_sources(&tbl, start, end, std::slice::from_ref(&pa))
        .await
        .unwrap();
    assert_eq!(w.not_ready, vec![pa]);
    assert_eq!(sources(&w), vec![day1, day2]);
}

/// Deletes the one row [`archived`] wrote into `bucket` at `at` (a mask, the bucket being
/// archived).
async fn delete_row(store: &Store, tbl: &TableId, bucket: &BucketId, at: &str) {
    let read_at = store.now().await.unwrap();
    store
        .apply_changes(
            tbl,
            read_at,
            &[pulpitum::store::RowChange {
                partition_key: bucket.partition_key.clone(),
                event_time: t(at),
                sort_key: pulpitum::model::SortKey::new(b"k".to_vec()).unwrap(),
                old_value: b"v".to_vec(),
                new_value: None,
            }],
        )
        .await
        .unwrap();
}

/// What a listing across partitions names, expanded as a scan does: each whole segment
/// into the buckets its "manifest" (`held`) holds within the interval, every other bucket
/// as listed. Panics on a bucket named twice.
fn expand(
    listing: &pulpitum::store::AcrossListing,
    held: &std::collections::BTreeMap<&str, Vec<BucketId>>,
    (from, to): (pulpitum::model::EventTime, pulpitum::model::EventTime),
) -> Vec<(BucketId, String)> {
    let mut out: Vec<(BucketId, String)> = Vec::new();
    for (key, n) in &listing.segments {
        let buckets = &held[key.as_str()];
        assert_eq!(
            *n,
            buckets.len() as u64,
            "{key}: the count its route records"
        );
        for b in buckets {
            let (s, e) = b.bucket_key.bounds();
            if e > from && s <= to {
                out.push((b.clone(), key.clone()));
            }
        }
    }
    for m in &listing.buckets {
        let route = match &m.state {
            BucketState::Archived { object_key, .. } => object_key.clone(),
            other => format!("{other:?}"),
        };
        out.push((m.id.clone(), route));
    }
    out.sort();
    let n = out.len();
    out.dedup_by(|a, b| a.0 == b.0);
    assert_eq!(out.len(), n, "a bucket named twice: {out:?}");
    out
}

/// The same interval listed bucket by bucket, as [`expand`] shapes it.
async fn listed(
    store: &Store,
    tbl: &TableId,
    (from, to): (pulpitum::model::EventTime, pulpitum::model::EventTime),
) -> Vec<(BucketId, String)> {
    let filter = BucketFilter {
        from: Some(from),
        to: Some(to),
        ..BucketFilter::default()
    };
    let mut out: Vec<(BucketId, String)> = store
        .list_buckets(tbl, &filter)
        .await
        .unwrap()
        .into_iter()
        .map(|m| {
            let route = match &m.state {
                BucketState::Archived { object_key, .. } => object_key.clone(),
                other => format!("{other:?}"),
            };
            (m.id, route)
        })
        .collect();
    out.sort();
    out
}

/// A listing across every partition (`list_across`) names a segment whole exactly while
/// every bucket its manifest holds is routed to it, and every other bucket of the interval
/// one by one, each once: expanded through the segments' contents it equals the listing
/// bucket by bucket after every step that moves routes into or out of segments (a switch, a
/// switch of part of a segment elsewhere, a drop, a count not known, a segment switched in
/// two transactions). A store that named a segment whole after a bucket left it would name
/// that bucket twice, or name one that no longer exists.
pub async fn a_listing_across_partitions_names_a_segment_only_while_it_holds_every_route(
    store: Store,
) {
    use std::collections::BTreeMap;
    let tbl = table(&store, "events", DAY).await;
    let Some(_) = store
        .list_across(&tbl, t("2024-03-01T00:00:00Z"), t("2024-03-31T23:59:59Z"))
        .await
        .unwrap()
    else {
        panic!("both stores list across partitions with segment routes");
    };
    let mut src = BTreeMap::new();
    let mut buckets = Vec::new();
    for (p, day) in [
        ("a", "01"),
        ("a", "02"),
        ("b", "01"),
        ("c", "01"),
        ("d", "02"),
    ] {
        let key = format!("t/{p}/{day}/m.json");
        let b = archived(
            &store,
            &tbl,
            p,
            &format!("2024-03-{day}T10:00:00Z"),
            &key,
            true,
        )
        .await;
        src.insert(b.clone(), key);
        buckets.push(b);
    }
    let [a1, a2, b1, c1, d2] = <[BucketId; 5]>::try_from(buckets).unwrap();
    let hot_e = hot(&store, &tbl, "e", "2024-03-03T10:00:00Z").await;
    let april = archived(
        &store,
        &tbl,
        "a",
        "2024-04-02T10:00:00Z",
        "t/a/apr/m.json",
        true,
    )
    .await;
    let march = (t("2024-03-01T00:00:00Z"), t("2024-03-31T23:59:59.999999Z"));
    let day2 = (t("2024-03-02T00:00:00Z"), t("2024-03-02T23:59:59.999999Z"));
    let all = (t("2024-01-01T00:00:00Z"), t("2024-12-31T00:00:00Z"));
    let s1 = "t/segments/month:2024-03/s00001-g1/manifest.json";
    let s2 = "t/segments/month:2024-03/s00002-g1/manifest.json";
    let s3 = "t/segments/month:2024-03/s00001-g2/manifest.json";
    let s4 = "t/segments/month:2024-03/s00002-g2/manifest.json";
    // What each segment's manifest holds (s2's also holds a bucket that was empty and
    // dropped instead of switched: its manifest says 2, one is ever routed there).
    let mut held: BTreeMap<&str, Vec<BucketId>> = BTreeMap::new();
    held.insert(s1, vec![a1.clone(), a2.clone(), b1.clone()]);
    held.insert(s2, vec![c1.clone(), hot_e.clone()]);
    held.insert(s3, vec![a1.clone()]);
    held.insert(s4, vec![d2.clone(), b1.clone()]);
    let check = |what: &'static str| {
        let store = store.clone();
        let tbl = tbl.clone();
        let held = held.clone();
        async move {
            for interval in [march, day2, all] {
                let listing = store
                    .list_across(&tbl, interval.0, interval.1)
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(
                    expand(&listing, &held, interval),
                    listed(&store, &tbl, interval).await,
                    "{what}: {interval:?}"
                );
            }
            let mut whole: Vec<String> = store
                .list_across(&tbl, march.0, march.1)
                .await
                .unwrap()
                .unwrap()
                .segments
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            whole.sort();
            whole
        }
    };
    assert!(check("per-bucket objects only").await.is_empty());

    let claim = claim_march(&store, &tbl, LONG).await.unwrap();
    let counted = |b: &BucketId, to: &str, n: u64| RouteSwitch {
        bucket: b.clone(),
        from_object_key: src[b].clone(),
        to_object_key: to.into(),
        to_buckets: Some(n),
    };
    store
        .switch_routes(
            &claim,
            &[
                counted(&a1, s1, 3),
                counted(&a2, s1, 3),
                counted(&b1, s1, 3),
                counted(&c1, s2, 2),
            ],
        )
        .await
        .unwrap();
    assert_eq!(check("s1 whole, s2 short of one").await, [s1]);
    store.release_compaction(&claim).await.unwrap();

    // A later compaction moves a1 out of s1 into s3: s1 is no longer whole.
    let claim = claim_march(&store, &tbl, LONG).await.unwrap();
    store
        .switch_routes(&claim, &[switch(&a1, s1, s3)])
        .await
        .unwrap();
    assert_eq!(
        check("a1 left s1 for s3, whose count is not known").await,
        Vec::<String>::new()
    );
    // s4 is switched in two transactions: whole only after both.
    store
        .switch_routes(&claim, &[counted(&d2, s4, 2)])
        .await
        .unwrap();
    let whole = check("s4 half switched").await;
    assert!(!whole.contains(&s4.to_string()), "{whole:?}");
    store
        .switch_routes(
            &claim,
            &[RouteSwitch {
                bucket: b1.clone(),
                from_object_key: s1.into(),
                to_object_key: s4.into(),
                to_buckets: Some(2),
            }],
        )
        .await
        .unwrap();
    let whole = check("s4 switched whole across two transactions").await;
    assert!(whole.contains(&s4.to_string()), "{whole:?}");
    // A drop takes a bucket out of its segment: s4 is short of one again.
    let dropped = store
        .drop_empty_buckets(
            &claim,
            &[CompactionSource {
                bucket: d2.clone(),
                bucket_start: d2.bucket_key.start(),
                bucket_end: d2.bucket_key.end(),
                object_key: s4.into(),
                masked: false,
            }],
        )
        .await
        .unwrap();
    assert_eq!(dropped, 1);
    let whole = check("d2 dropped from s4").await;
    assert!(!whole.contains(&s4.to_string()), "{whole:?}");
    store.release_compaction(&claim).await.unwrap();
    let _ = (april, hot_e);
}

/// Segments recorded with their bucket count not known are listed across pages in key
/// order, each once; recording a count makes a listing across partitions name the segment
/// whole (its every bucket being routed to it), and is done once: a count recorded already,
/// by this call or by a switch, is left as it is, and an unknown segment records nothing.
pub async fn segment_counts_not_known_are_listed_in_pages_and_recorded_once(store: Store) {
    let tbl = table(&store, "events", DAY).await;
    let a1 = archived(&store, &tbl, "a", "2024-03-01T10:00:00Z", "t/a/1", true).await;
    let b1 = archived(&store, &tbl, "b", "2024-03-01T10:00:00Z", "t/b/1", true).await;
    let c1 = archived(&store, &tbl, "c", "2024-03-01T10:00:00Z", "t/c/1", true).await;
    let d1 = archived(&store, &tbl, "d", "2024-03-01T10:00:00Z", "t/d/1", true).await;
    let s1 = "t/segments/month:2024-03/s00001-g1/manifest.json";
    let s2 = "t/segments/month:2024-03/s00002-g1/manifest.json";
    let claim = claim_march(&store, &tbl, LONG).await.unwrap();
    store
        .switch_routes(
            &claim,
            &[
                switch(&a1, "t/a/1", s1),
                switch(&b1, "t/b/1", s1),
                switch(&c1, "t/c/1", s2),
            ],
        )
        .await
        .unwrap();
    let key = |k: &str| (tbl.clone(), k.to_string());
    assert_eq!(
        store.segments_not_counted(None, 10).await.unwrap(),
        [key(s1), key(s2)]
    );
    assert_eq!(
        store.segments_not_counted(None, 1).await.unwrap(),
        [key(s1)]
    );
    assert_eq!(
        store.segments_not_counted(Some(&key(s1)), 1).await.unwrap(),
        [key(s2)]
    );
    assert!(store
        .segments_not_counted(Some(&key(s2)), 1)
        .await
        .unwrap()
        .is_empty());
    let march = (t("2024-03-01T00:00:00Z"), t("2024-03-31T23:59:59Z"));
    let whole = || async {
        store
            .list_across(&tbl, march.0, march.1)
            .await
            .unwrap()
            .unwrap()
            .segments
    };
    assert!(whole().await.is_empty(), "a count not known is never whole");

    assert!(store.record_segment_count(&tbl, s1, 2).await.unwrap());
    assert!(
        !store.record_segment_count(&tbl, s1, 5).await.unwrap(),
        "a recorded count is kept"
    );
    assert_eq!(
        store.segments_not_counted(None, 10).await.unwrap(),
        [key(s2)]
    );
    assert_eq!(whole().await, [(s1.to_string(), 2)]);
    // A switch of s2's other bucket records its count first: recording it again changes
    // nothing.
    store
        .switch_routes(
            &claim,
            &[RouteSwitch {
                bucket: d1.clone(),
                from_object_key: "t/d/1".into(),
                to_object_key: s2.into(),
                to_buckets: Some(2),
            }],
        )
        .await
        .unwrap();
    assert!(!store.record_segment_count(&tbl, s2, 7).await.unwrap());
    assert!(store
        .segments_not_counted(None, 10)
        .await
        .unwrap()
        .is_empty());
    let mut named = whole().await;
    named.sort();
    assert_eq!(named, [(s1.to_string(), 2), (s2.to_string(), 2)]);
    assert!(!store
        .record_segment_count(&tbl, "t/segments/month:2024-03/s00009-g1/manifest.json", 1)
        .await
        .unwrap());
}
