//! Segments (manifest v5) on every backend: many partitions' buckets in one object, one
//! partition read with ranged reads verified per row group, side by side with per-bucket
//! archives, and every damaged or misplaced object refused with a typed error.

use super::*;
use pulpitum::archive::{RouteManifest, SegmentManifest, SegmentSpec};

fn spec(generation: i64, ordinal: u32) -> SegmentSpec {
    SegmentSpec {
        table_id: TableId::new("chat").unwrap(),
        strategy: pulpitum::model::BucketStrategy::CalendarDayUtc,
        window: BucketKey::parse_any("month:2024-03").unwrap(),
        generation,
        ordinal,
    }
}

/// Rows of `partitions` partitions over three day buckets of March 2024, sorted as a segment
/// holds them; partition 0 is large enough to fill row groups of its own.
fn window_rows(partitions: u8) -> Vec<(BucketId, Vec<Record>)> {
    let mut out = Vec::new();
    for pk in 0..partitions {
        for day in ["2024-03-01", "2024-03-02", "2024-03-31"] {
            let b = bucket(day, pk);
            let n = if pk == 0 { 6000 } else { 60 + pk as usize };
            out.push((b.clone(), records(&b, n, pk)));
        }
    }
    out
}

fn flat(rows: &[(BucketId, Vec<Record>)]) -> Vec<Record> {
    rows.iter().flat_map(|(_, r)| r.clone()).collect()
}

async fn scan_route_all(
    store: &ArchiveStore,
    route: &RouteManifest,
    b: &BucketId,
    req: &ArchiveScan,
) -> Result<Vec<Record>, ArchiveError> {
    let stream = store
        .scan_route(route, b, req, Arc::new(ArchiveScanMetrics::default()))
        .await?;
    let batches: Vec<_> = stream
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    batches_to_records(&batches)
}

#[tokio::test]
async fn a_segment_serves_every_bucket_exactly_and_one_partition_in_few_reads() {
    for be in backends("segment_round_trip").await {
        let rows = window_rows(5);
        let written = be
            .store
            .write_segment(&spec(1, 0), &flat(&rows))
            .await
            .unwrap();
        let m = &written.manifest;
        assert_eq!(m.partitions.len(), 5, "{}", be.name);
        assert!(
            m.row_groups.len() >= 2,
            "{}: partition 0 has groups of its own",
            be.name
        );
        for (b, want) in &rows {
            let route = be.store.open_route(&written.manifest_key, b).await.unwrap();
            assert!(matches!(route, RouteManifest::Segment(_)));
            let got = scan_route_all(&be.store, &route, b, &ArchiveScan::default())
                .await
                .unwrap();
            assert_eq!(&got, want, "{}: {b}", be.name);
            // Descending, bounded, in small batches: the same rows as the reference filter.
            let t = want[want.len() / 2].event_time;
            let req = ArchiveScan {
                bounds: ScanBounds {
                    time_upper: Bound::Included(t),
                    ..ScanBounds::all()
                },
                descending: true,
                batch_rows: 7,
                ..ArchiveScan::default()
            };
            let mut expect: Vec<Record> = want
                .iter()
                .filter(|r| req.bounds.matches(r))
                .cloned()
                .collect();
            expect.reverse();
            let got = scan_route_all(&be.store, &route, b, &req).await.unwrap();
            assert_eq!(got, expect, "{}: {b} descending", be.name);
            let all = be.store.read_bucket(&route, b).await.unwrap();
            assert_eq!(&all, want);
        }
        // A fresh store (nothing cached): latest 50 of one small partition costs the
        // manifest, the footer and one row group; with both cached, one ranged read.
        let fresh = ArchiveStore::from_operator(be.store.operator().clone(), be.store.prefix());
        let (b, want) = &rows[3 * 3 + 2];
        let route = fresh.open_route(&written.manifest_key, b).await.unwrap();
        let metrics = Arc::new(ArchiveScanMetrics::default());
        let req = ArchiveScan {
            descending: true,
            batch_rows: 50,
            ..ArchiveScan::default()
        };
        let first = fresh
            .scan_route(&route, b, &req, metrics.clone())
            .await
            .unwrap()
            .next()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first.num_rows(), 50);
        let snap = metrics.snapshot();
        assert_eq!(snap.requests, 2, "{}: footer and one row group", be.name);
        let other = &rows[3 * 4].0;
        let route = fresh
            .open_route(&written.manifest_key, other)
            .await
            .unwrap();
        let metrics = Arc::new(ArchiveScanMetrics::default());
        let batches: Vec<_> = fresh
            .scan_route(&route, other, &req, metrics.clone())
            .await
            .unwrap()
            .collect()
            .await;
        assert!(batches.iter().all(|b| b.is_ok()));
        assert_eq!(metrics.snapshot().requests, 1, "{}: footer cached", be.name);
        assert!(want.len() > 50);
    }
}

#[tokio::test]
async fn per_row_group_digests_confine_damage_to_the_partitions_it_touches() {
    for be in backends("segment_damage").await {
        let rows = window_rows(4);
        let written = be
            .store
            .write_segment(&spec(1, 0), &flat(&rows))
            .await
            .unwrap();
        let m = written.manifest.clone();
        let op = be.store.operator();
        let mut bytes = op.read(&m.payload_key).await.unwrap().to_vec();
        // Flip one byte inside the last row group (the small partitions).
        let last = m.row_groups.last().unwrap();
        bytes[(last.range.offset + last.range.length / 2) as usize] ^= 0x55;
        op.delete(&m.payload_key).await.unwrap();
        op.write(&m.payload_key, bytes).await.unwrap();
        let fresh = ArchiveStore::from_operator(op.clone(), be.store.prefix());
        // Partition 0 lives in the first row groups: still readable, exactly.
        let (b0, want0) = &rows[0];
        let route = fresh.open_route(&written.manifest_key, b0).await.unwrap();
        let got = scan_route_all(&fresh, &route, b0, &ArchiveScan::default())
            .await
            .unwrap();
        assert_eq!(&got, want0, "{}", be.name);
        // The last partition's group is damaged: a typed error, no rows.
        let (b3, _) = &rows[3 * 3];
        let route = fresh.open_route(&written.manifest_key, b3).await.unwrap();
        let err = scan_route_all(&fresh, &route, b3, &ArchiveScan::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ArchiveError::ChecksumMismatch { key, .. } if key.contains("row group")),
            "{}: {err}",
            be.name
        );
    }
}

#[tokio::test]
async fn manifests_v4_v5_and_v6_coexist_and_other_versions_are_refused() {
    for be in backends("segment_versions").await {
        let b = bucket("2024-03-05", 9);
        let rs = records(&b, 30, 1);
        let w = be
            .store
            .write_bucket(&b, 1, PayloadFormat::Parquet, pages(&rs, 100))
            .await
            .map_err(WriteError::into_archive)
            .unwrap();
        let route = be.store.open_route(&w.manifest_key, &b).await.unwrap();
        assert!(matches!(route, RouteManifest::Bucket(_)));
        assert_eq!(
            scan_route_all(&be.store, &route, &b, &ArchiveScan::default())
                .await
                .unwrap(),
            rs
        );

        let rows = window_rows(2);
        let seg = be
            .store
            .write_segment(&spec(2, 0), &flat(&rows))
            .await
            .unwrap();
        let text = String::from_utf8(
            be.store
                .operator()
                .read(&seg.manifest_key)
                .await
                .unwrap()
                .to_vec(),
        )
        .unwrap();
        assert!(text.contains("\"manifest_version\":6"), "{text}");
        let v7 = text.replacen("\"manifest_version\":6", "\"manifest_version\":7", 1);
        let key7 = seg.manifest_key.replace("-g2/", "-g7/");
        be.store.operator().write(&key7, v7).await.unwrap();
        let err = be.store.open_route(&key7, &rows[0].0).await.unwrap_err();
        assert!(
            matches!(err, ArchiveError::UnsupportedManifestVersion(7)),
            "{}: {err}",
            be.name
        );
        // The same segment described by a v5 manifest (no per-group bounds), as written
        // before v6: still read, every bucket exactly. v6 without bounds, or v5 with them,
        // is refused.
        let mut doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let groups_of = |doc: &mut serde_json::Value| {
            for p in doc["partitions"].as_array_mut().unwrap() {
                p.as_object_mut().unwrap().remove("groups");
            }
        };
        let with_groups = doc.clone();
        groups_of(&mut doc);
        let no_groups_v6 = serde_json::to_string(&doc).unwrap();
        doc["manifest_version"] = 5.into();
        let v5 = serde_json::to_string(&doc).unwrap();
        let mut groups_v5 = with_groups;
        groups_v5["manifest_version"] = 5.into();
        let op = be.store.operator();
        for (body, ok) in [
            (v5, true),
            (no_groups_v6, false),
            (serde_json::to_string(&groups_v5).unwrap(), false),
        ] {
            op.delete(&seg.manifest_key).await.unwrap();
            op.write(&seg.manifest_key, body).await.unwrap();
            let fresh = ArchiveStore::from_operator(op.clone(), be.store.prefix());
            let opened = fresh.open_route(&seg.manifest_key, &rows[0].0).await;
            if !ok {
                assert!(
                    matches!(opened, Err(ArchiveError::InvalidManifest { .. })),
                    "{}: {opened:?}",
                    be.name
                );
                continue;
            }
            for (b, want) in &rows {
                let route = fresh.open_route(&seg.manifest_key, b).await.unwrap();
                assert!(matches!(&route, RouteManifest::Segment(m) if m.version == 5));
                let got = scan_route_all(&fresh, &route, b, &ArchiveScan::default())
                    .await
                    .unwrap();
                assert_eq!(&got, want, "{}: v5 {b}", be.name);
            }
        }
        op.delete(&seg.manifest_key).await.unwrap();
        op.write(&seg.manifest_key, text.clone()).await.unwrap();
        // A bucket the segment does not hold, and a manifest copied elsewhere: refused.
        let err = be
            .store
            .open_route(&seg.manifest_key, &b)
            .await
            .unwrap_err();
        assert!(
            matches!(err, ArchiveError::IdentityMismatch { .. }),
            "{err}"
        );
        let copied = seg.manifest_key.replace("s00000-g2", "s00001-g2");
        be.store
            .operator()
            .write(&copied, text.clone())
            .await
            .unwrap();
        let err = be.store.open_route(&copied, &rows[0].0).await.unwrap_err();
        assert!(
            matches!(err, ArchiveError::IdentityMismatch { .. }),
            "{err}"
        );
        // Truncated manifest: invalid, typed.
        let cut = seg.manifest_key.replace("s00000-g2", "s00002-g2");
        be.store
            .operator()
            .write(&cut, text[..text.len() / 2].to_string())
            .await
            .unwrap();
        let err = be.store.open_route(&cut, &rows[0].0).await.unwrap_err();
        assert!(matches!(err, ArchiveError::InvalidManifest { .. }), "{err}");
    }
}

#[tokio::test]
async fn segment_writes_are_checked_create_once_and_idempotent() {
    for be in backends("segment_writes").await {
        let rows = flat(&window_rows(3));
        // Unsorted and out-of-window rows are refused before anything is written.
        let mut unsorted = rows.clone();
        unsorted.swap(0, 1);
        let err = be
            .store
            .write_segment(&spec(1, 0), &unsorted)
            .await
            .unwrap_err();
        assert!(matches!(err, ArchiveError::InvalidInput { .. }), "{err}");
        let outside = records(&bucket("2024-04-01", 1), 3, 0);
        let err = be
            .store
            .write_segment(&spec(1, 0), &outside)
            .await
            .unwrap_err();
        assert!(matches!(err, ArchiveError::InvalidInput { .. }), "{err}");
        assert!(
            be.store.list_objects().await.unwrap().is_empty(),
            "{}",
            be.name
        );
        // The same rows twice under one generation: the retry finds its own segment.
        let a = be.store.write_segment(&spec(1, 0), &rows).await.unwrap();
        let b = be.store.write_segment(&spec(1, 0), &rows).await.unwrap();
        assert_eq!(a.manifest_key, b.manifest_key);
        // Different rows at an existing key never overwrite it.
        let err = be
            .store
            .write_segment(&spec(1, 0), &rows[1..])
            .await
            .unwrap_err();
        assert!(
            matches!(err, ArchiveError::AlreadyExistsDifferent { .. }),
            "{err}"
        );
        let m = SegmentManifest::parse(
            &be.store
                .operator()
                .read(&a.manifest_key)
                .await
                .unwrap()
                .to_vec(),
            &a.manifest_key,
        )
        .unwrap();
        assert_eq!(m.row_count, rows.len() as u64);
    }
}

#[cfg(feature = "failpoints")]
#[tokio::test]
async fn an_encoder_that_alters_a_row_never_gets_a_manifest() {
    let store = ArchiveStore::from_url(&format!("memory://{}", unique("segment_lossy")))
        .unwrap()
        .with_lossy_encoder();
    let rows = flat(&window_rows(2));
    let err = store.write_segment(&spec(1, 0), &rows).await.unwrap_err();
    // Counts and keys are consistent: only the decoded comparison refuses it.
    assert!(
        matches!(&err, ArchiveError::Decode { reason, .. } if reason.contains("differ")),
        "{err}"
    );
    let keys: Vec<String> = store
        .list_objects()
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert!(
        keys.iter().all(|k| !k.ends_with("manifest.json")),
        "{keys:?}"
    );
}

/// `n` rows of one partition in one day bucket of March 2024, a few per microsecond.
fn big_partition(n: usize) -> (BucketId, Vec<Record>) {
    let b = bucket("2024-03-10", 7);
    let start = b.bucket_key.start().as_micros();
    let rows = (0..n)
        .map(|i| Record {
            partition_key: b.partition_key.clone(),
            event_time: EventTime::from_micros(start + (i as i64 / 2) * 101).unwrap(),
            sort_key: SortKey::new(vec![(i % 2) as u8]).unwrap(),
            value: format!("m{i}").into_bytes(),
        })
        .collect();
    (b, rows)
}

/// A partition spanning several row groups (more than 65,536 rows) reads back whole, and
/// its latest page, through the ranged, digest-checked reader queries use, on every backend.
#[tokio::test]
async fn a_partition_spanning_many_row_groups_reads_back_whole() {
    for n in [100_000usize, 200_000] {
        for be in backends("segment_multi_group").await {
            let (b, want) = big_partition(n);
            let written = be.store.write_segment(&spec(1, 0), &want).await.unwrap();
            assert!(
                written.manifest.row_groups.len() >= 2,
                "{}: {n} rows in {} row groups",
                be.name,
                written.manifest.row_groups.len()
            );
            let fresh = ArchiveStore::from_operator(be.store.operator().clone(), be.store.prefix());
            let route = fresh.open_route(&written.manifest_key, &b).await.unwrap();
            let got = scan_route_all(&fresh, &route, &b, &ArchiveScan::default())
                .await
                .unwrap();
            assert_eq!(got.len(), n, "{}: count", be.name);
            assert!(got == want, "{}: rows differ", be.name);
            let req = ArchiveScan {
                descending: true,
                batch_rows: 50,
                ..ArchiveScan::default()
            };
            let page_store =
                ArchiveStore::from_operator(be.store.operator().clone(), be.store.prefix());
            let route = page_store
                .open_route(&written.manifest_key, &b)
                .await
                .unwrap();
            let metrics = Arc::new(ArchiveScanMetrics::default());
            let first = page_store
                .scan_route(&route, &b, &req, metrics.clone())
                .await
                .unwrap()
                .next()
                .await
                .unwrap()
                .unwrap();
            let page = batches_to_records(&[first]).unwrap();
            let mut expect: Vec<Record> = want[n - 50..].to_vec();
            expect.reverse();
            assert_eq!(page, expect, "{}: latest 50", be.name);
            // Pruned: the footer and the last row group only, whatever the partition's size.
            let m = &written.manifest;
            let snap = metrics.snapshot();
            let last = m.row_groups.last().unwrap().range.length;
            assert_eq!(snap.requests, 2, "{}: footer and one group", be.name);
            assert_eq!(snap.bytes_read, m.footer.length + last, "{}", be.name);
            // A read bounded to the first rows fetches the first group only.
            let metrics = Arc::new(ArchiveScanMetrics::default());
            let req = ArchiveScan {
                bounds: ScanBounds {
                    time_upper: Bound::Included(want[10].event_time),
                    ..ScanBounds::all()
                },
                ..ArchiveScan::default()
            };
            let got = batches_to_records(
                &page_store
                    .scan_route(&route, &b, &req, metrics.clone())
                    .await
                    .unwrap()
                    .map(|b| b.unwrap())
                    .collect::<Vec<_>>()
                    .await,
            )
            .unwrap();
            let expect: Vec<Record> = want
                .iter()
                .filter(|r| req.bounds.matches(r))
                .cloned()
                .collect();
            assert_eq!(got, expect, "{}: first rows", be.name);
            let snap = metrics.snapshot();
            assert_eq!(snap.requests, 1, "{}: footer cached, first group", be.name);
            assert_eq!(
                snap.row_groups_pruned as usize,
                m.row_groups.len() - 1,
                "{}",
                be.name
            );
        }
    }
}

/// The rows of a run read as one, with the number of buckets each batch begins.
async fn run_all(
    store: &ArchiveStore,
    route: &RouteManifest,
    run: &[BucketId],
    req: &ArchiveScan,
) -> Result<(Vec<Record>, u32, usize), ArchiveError> {
    let stream = store
        .scan_segment_run(route, run, req, Arc::new(ArchiveScanMetrics::default()))?
        .expect("a v6 segment is read as a run");
    let items: Vec<(_, u32)> = stream
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let begun = items.iter().map(|(_, n)| n).sum();
    let batches: Vec<_> = items.into_iter().map(|(b, _)| b).collect();
    Ok((batches_to_records(&batches)?, begun, batches.len()))
}

/// A run of buckets (the unit a window-wide scan reads a segment by) returns exactly its
/// buckets' rows, in either order and under bounds, in batches of many buckets, and never
/// the rows of a bucket between two of its buckets that it does not name (that bucket's
/// route may lead elsewhere); a bucket of another partition, or one the segment does not
/// hold, is refused; a manifest that misstates a bucket's rows is refused as a bucket read
/// refuses it.
#[tokio::test]
async fn a_run_of_buckets_reads_exactly_its_buckets_in_few_batches() {
    for be in backends("segment_runs").await {
        let rows = window_rows(3);
        let written = be
            .store
            .write_segment(&spec(1, 0), &flat(&rows))
            .await
            .unwrap();
        for pk in 0..3u8 {
            let mine: Vec<&(BucketId, Vec<Record>)> = rows
                .iter()
                .filter(|(b, _)| b.partition_key == bucket("2024-03-01", pk).partition_key)
                .collect();
            let run: Vec<BucketId> = mine.iter().map(|(b, _)| b.clone()).collect();
            let route = be
                .store
                .open_route(&written.manifest_key, &run[0])
                .await
                .unwrap();
            let want: Vec<Record> = mine.iter().flat_map(|(_, r)| r.clone()).collect();
            let (got, begun, batches) = run_all(&be.store, &route, &run, &ArchiveScan::default())
                .await
                .unwrap();
            assert_eq!(got, want, "{}: partition {pk}", be.name);
            assert_eq!(begun, 3, "{}: every bucket counted once", be.name);
            if pk > 0 {
                // Three small buckets in one row group leave as one batch, not three.
                assert_eq!(batches, 1, "{}: partition {pk}", be.name);
            }
            // Newest first, bounded, in small batches: the reference filter, reversed.
            let t = want[want.len() / 2].event_time;
            let req = ArchiveScan {
                bounds: ScanBounds {
                    time_upper: Bound::Included(t),
                    ..ScanBounds::all()
                },
                descending: true,
                batch_rows: 7,
                ..ArchiveScan::default()
            };
            let (got, _, _) = run_all(&be.store, &route, &run, &req).await.unwrap();
            let mut expect: Vec<Record> =
                want.iter().filter(|r| r.event_time <= t).cloned().collect();
            expect.reverse();
            assert_eq!(got, expect, "{}: partition {pk}, descending", be.name);
            // In batches of 7 rows, each bucket is counted on the batch holding its first
            // row (a LIMIT cutting after that batch leaves the later buckets uncounted).
            if pk > 0 {
                let req = ArchiveScan {
                    batch_rows: 7,
                    ..ArchiveScan::default()
                };
                let items: Vec<(_, u32)> = be
                    .store
                    .scan_segment_run(&route, &run, &req, Arc::new(ArchiveScanMetrics::default()))
                    .unwrap()
                    .unwrap()
                    .collect::<Vec<_>>()
                    .await
                    .into_iter()
                    .collect::<Result<_, _>>()
                    .unwrap();
                let mut want_begun = vec![0u32; items.len()];
                let mut at = 0;
                for (_, rs) in &mine {
                    want_begun[at / 7] += 1;
                    at += rs.len();
                }
                let begun: Vec<u32> = items.iter().map(|(_, n)| *n).collect();
                assert_eq!(begun, want_begun, "{}: partition {pk}", be.name);
            }
            // The middle bucket left out: none of its rows, though they lie between.
            let ends = [run[0].clone(), run[2].clone()];
            let (got, begun, _) = run_all(&be.store, &route, &ends, &ArchiveScan::default())
                .await
                .unwrap();
            let expect: Vec<Record> = [&mine[0].1, &mine[2].1]
                .into_iter()
                .flatten()
                .cloned()
                .collect();
            assert_eq!(
                got, expect,
                "{}: partition {pk} without its middle bucket",
                be.name
            );
            assert_eq!(begun, 2, "{}", be.name);
        }
        // A run across partitions, or naming a bucket the segment lacks, is refused.
        let route = be
            .store
            .open_route(&written.manifest_key, &rows[0].0)
            .await
            .unwrap();
        let across = [rows[0].0.clone(), rows[3].0.clone()];
        assert!(
            run_all(&be.store, &route, &across, &ArchiveScan::default())
                .await
                .is_err(),
            "{}: a run spanning partitions",
            be.name
        );
        let absent = [rows[0].0.clone(), bucket("2024-03-15", 0)];
        let err = run_all(&be.store, &route, &absent, &ArchiveScan::default())
            .await
            .unwrap_err();
        assert!(
            matches!(
                &err,
                ArchiveError::IdentityMismatch {
                    field: "bucket_key",
                    ..
                }
            ),
            "{}: {err}",
            be.name
        );
    }
}

/// A manifest whose bucket row counts were swapped (the partition's total still right)
/// is caught by a run's per-bucket count, as by a bucket read: the run's rows are checked
/// bucket by bucket, not only as a whole.
#[tokio::test]
async fn a_run_checks_each_buckets_count_against_the_manifest() {
    for be in backends("segment_run_counts").await {
        let (b1, b2) = (bucket("2024-03-01", 4), bucket("2024-03-02", 4));
        let (r1, r2) = (records(&b1, 10, 4), records(&b2, 25, 4));
        let all: Vec<Record> = r1.iter().chain(&r2).cloned().collect();
        let written = be.store.write_segment(&spec(1, 0), &all).await.unwrap();
        let op = be.store.operator();
        let text =
            String::from_utf8(op.read(&written.manifest_key).await.unwrap().to_vec()).unwrap();
        let mut doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let buckets = doc["partitions"][0]["buckets"].as_array_mut().unwrap();
        assert_eq!(buckets.len(), 2);
        let (a, b) = (buckets[0]["rows"].clone(), buckets[1]["rows"].clone());
        buckets[0]["rows"] = b;
        buckets[1]["rows"] = a;
        // Over the real manifest (a fresh store: the first keeps the parsed one cached).
        op.delete(&written.manifest_key).await.unwrap();
        op.write(&written.manifest_key, serde_json::to_vec(&doc).unwrap())
            .await
            .unwrap();
        let forged = ArchiveStore::from_operator(op.clone(), be.store.prefix());
        let route = forged.open_route(&written.manifest_key, &b1).await.unwrap();
        let err = run_all(
            &forged,
            &route,
            &[b1.clone(), b2.clone()],
            &ArchiveScan::default(),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&err, ArchiveError::RowCountMismatch { key, expected: 25, actual: 10 } if key.contains("2024-03-01")),
            "{}: {err}",
            be.name
        );
        // The honest manifest reads both.
        op.delete(&written.manifest_key).await.unwrap();
        op.write(&written.manifest_key, text.into_bytes())
            .await
            .unwrap();
        let honest = ArchiveStore::from_operator(op.clone(), be.store.prefix());
        let route = honest.open_route(&written.manifest_key, &b1).await.unwrap();
        let (got, _, _) = run_all(&honest, &route, &[b1, b2], &ArchiveScan::default())
            .await
            .unwrap();
        assert_eq!(got, all, "{}", be.name);
    }
}
