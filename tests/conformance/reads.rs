//! Conformance cases for the store's routed reads (`RoutedReads` in `src/store/roles.rs`):
//! bucket listings filtered by partition and time, pages of hot rows that agree with
//! `ScanBounds::matches` and carry their route (ARCHITECTURE.md invariant 7), and
//! `read_head`, which must return what a listing and a page read of the first bucket
//! return.

use std::collections::BTreeSet;
use std::ops::Bound;

use pulpitum::model::{batch_to_records, records_to_batch};
use pulpitum::model::{
    BucketStrategy, ClusteringKey, EventTime, PartitionKey, Record, ScanBounds, SortKey, TableId,
};
use pulpitum::store::{BucketFilter, BucketState, HotPage, PageRequest, RoutedBucket};

use super::{bucket_of, pk, rec, t, table, Store, LONG};

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
