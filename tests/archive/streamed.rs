//! The streamed segment writer on every backend: rows pushed in pieces of any size, a
//! partition spanning many row groups, a payload large enough for a multipart upload under
//! a unique key (radosgw checked by the multipart ETag), and a stored payload damaged after
//! its upload refused by the verification by ranges, before any manifest exists.

use super::*;
use pulpitum::archive::{SegmentManifest, SegmentSpec, SegmentUpload, WriteFault};

fn spec(generation: i64) -> SegmentSpec {
    SegmentSpec {
        table_id: TableId::new("chat").unwrap(),
        strategy: pulpitum::model::BucketStrategy::CalendarDayUtc,
        window: BucketKey::parse_any("month:2024-03").unwrap(),
        generation,
        ordinal: 0,
    }
}

/// Sorted rows: a small partition, one of `big` rows over two days, another small one.
/// With `value_len` > 0 the values are that many incompressible bytes.
fn window(big: usize, value_len: usize) -> Vec<Record> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut out = Vec::new();
    for (pk, n) in [(1u8, 300usize), (2, big), (3, 200)] {
        for (d, day) in ["2024-03-04", "2024-03-05"].into_iter().enumerate() {
            let b = bucket(day, pk);
            let start = b.bucket_key.start().as_micros();
            for i in 0..n / 2 {
                let mut value = format!("p{pk} d{d} m{i}").into_bytes();
                while value.len() < value_len {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    value.extend_from_slice(&x.to_le_bytes());
                }
                out.push(Record {
                    partition_key: b.partition_key.clone(),
                    event_time: EventTime::from_micros(start + i as i64 * 7).unwrap(),
                    sort_key: SortKey::new(vec![(i % 3) as u8]).unwrap(),
                    value,
                });
            }
        }
    }
    out
}

/// Pushes `rows` in pieces of uneven sizes (the writer's result must not depend on them).
async fn write(
    store: &ArchiveStore,
    generation: i64,
    upload: &SegmentUpload,
    rows: &[Record],
) -> Result<pulpitum::archive::WrittenSegment, ArchiveError> {
    let mut w = store.segment_writer(&spec(generation), upload)?;
    let mut at = 0;
    for size in [1usize, 999, 7, 20_000].into_iter().cycle() {
        if at >= rows.len() {
            break;
        }
        let to = (at + size).min(rows.len());
        w.push(rows[at..to].to_vec())?;
        at = to;
    }
    assert_eq!(w.rows(), rows.len() as u64);
    w.finish().await
}

/// Every bucket of the segment, read back through the query reader, equals the rows.
async fn read_back(store: &ArchiveStore, key: &str, m: &SegmentManifest, rows: &[Record]) {
    let fresh = ArchiveStore::from_operator(store.operator().clone(), store.prefix());
    let mut got = Vec::new();
    for (b, want) in m.buckets() {
        let route = fresh.open_route(key, &b).await.unwrap();
        let s = fresh
            .scan_route(
                &route,
                &b,
                &ArchiveScan::default(),
                Arc::new(ArchiveScanMetrics::default()),
            )
            .await
            .unwrap();
        let batches: Vec<_> = s.map(|b| b.unwrap()).collect().await;
        let rs = batches_to_records(&batches).unwrap();
        assert_eq!(rs.len() as u64, want, "{b}");
        got.extend(rs);
    }
    assert!(got == rows, "rows read back differ from the rows written");
}

/// A partition of 150,000 rows pushed in uneven pieces spans several row groups, each
/// verified slice by slice; the payload is the same bytes as the one-call writer's.
#[tokio::test]
async fn a_streamed_partition_spans_many_row_groups_and_reads_back_exactly() {
    for be in backends("streamed_groups").await {
        let rows = window(150_000, 0);
        let w = write(&be.store, 1, &SegmentUpload::default(), &rows)
            .await
            .unwrap();
        let m = &w.manifest;
        assert!(m.payload_key.ends_with("/payload.parquet"), "{}", be.name);
        let big = m
            .partitions
            .iter()
            .find(|p| p.rows == 150_000)
            .expect("the big partition");
        assert!(big.slices.len() >= 3, "{}: {:?}", be.name, big.slices.len());
        read_back(&be.store, &w.manifest_key, m, &rows).await;
        // The same rows in one call: the same payload bytes (a retry compares them).
        let again = be.store.write_segment(&spec(1), &rows).await.unwrap();
        assert_eq!(again.manifest.sha256, m.sha256, "{}", be.name);
    }
}

/// Settings that force a multipart upload of a ~12 MiB payload in 5 MiB parts.
fn multipart() -> SegmentUpload {
    SegmentUpload {
        put_max_bytes: 1 << 20,
        part_bytes: 5 << 20,
        ..SegmentUpload::default()
    }
}

/// A payload above the single-PUT limit is a multipart upload (radosgw: the ETag of a
/// multipart object ends in `-<parts>`) at a key with a nonce; it reads back exactly. A
/// second writer of the same generation (a retry) uploads under its own nonce, never over
/// the first's payload, then finds the first's manifest, keeps it and removes its own
/// payload.
#[tokio::test]
async fn a_large_payload_is_a_multipart_upload_under_a_unique_key() {
    for be in backends("streamed_multipart").await {
        let rows = window(4_000, 3_000);
        let w = write(&be.store, 2, &multipart(), &rows).await.unwrap();
        let m = &w.manifest;
        assert!(m.byte_length > 10 << 20, "{}: {}", be.name, m.byte_length);
        let name = m.payload_key.rsplit('/').next().unwrap();
        assert!(
            name.starts_with("payload-") && name.len() == "payload-.parquet".len() + 32,
            "{}: {name}",
            be.name
        );
        if be.name == "s3" {
            let etag = be
                .store
                .operator()
                .stat(&m.payload_key)
                .await
                .unwrap()
                .etag()
                .unwrap_or_default()
                .to_string();
            let parts = m.byte_length.div_ceil(5 << 20);
            assert!(
                etag.trim_matches('"').ends_with(&format!("-{parts}")),
                "s3 etag {etag}: not a multipart upload of {parts} parts"
            );
        }
        read_back(&be.store, &w.manifest_key, m, &rows).await;
        let retry = write(&be.store, 2, &multipart(), &rows).await.unwrap();
        assert_eq!(retry.manifest_key, w.manifest_key, "{}", be.name);
        assert_eq!(retry.manifest.payload_key, m.payload_key, "{}", be.name);
        let payloads: Vec<String> = be
            .store
            .list_objects()
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .filter(|k| k.contains("/payload"))
            .collect();
        assert_eq!(payloads, vec![m.payload_key.clone()], "{}", be.name);
    }
}

/// A payload damaged on its way to the store (a flipped bit, a lost tail) is refused by
/// the verification by ranges, through the one-PUT and the multipart path, and no manifest
/// is written.
#[tokio::test]
async fn a_damaged_stored_payload_is_refused_before_any_manifest() {
    for be in backends("streamed_damage").await {
        let mut generation = 10;
        for (path, upload, rows) in [
            ("put", SegmentUpload::default(), window(2_000, 200)),
            ("multipart", multipart(), window(4_000, 3_000)),
        ] {
            for fault in [WriteFault::FlipBit, WriteFault::Truncate] {
                generation += 1;
                let ctx = format!("{} {path} {fault:?}", be.name);
                let layer = FaultLayer::new(FaultPlan::new(3).damage_writes(fault, "/payload"));
                let store = be.store.with_faults(layer.clone());
                let err = write(&store, generation, &upload, &rows)
                    .await
                    .map(|w| w.manifest_key)
                    .expect_err(&format!("{ctx}: a damaged payload got a manifest"));
                assert!(layer.stats().damaged_writes >= 1, "{ctx}: nothing damaged");
                let expected = match fault {
                    WriteFault::FlipBit => matches!(err, ArchiveError::ChecksumMismatch { .. }),
                    _ => matches!(err, ArchiveError::LengthMismatch { .. }),
                };
                assert!(expected, "{ctx}: unexpected error {err}");
                let manifests = be
                    .store
                    .list_objects()
                    .await
                    .unwrap()
                    .into_iter()
                    .filter(|o| o.key.contains(&format!("-g{generation}/manifest")))
                    .count();
                assert_eq!(manifests, 0, "{ctx}: a manifest was written");
            }
        }
    }
}

/// An encoder that alters one value, rows pushed in pieces, through the multipart path: the bytes stored are the bytes encoded and every key
/// and count is consistent, so only the slice digests (rows handed in against rows decoded
/// through the ranged reader) can refuse it.
#[cfg(feature = "failpoints")]
#[tokio::test]
async fn an_altered_row_is_caught_by_the_slice_digests_on_the_streamed_path() {
    let store = ArchiveStore::from_url(&format!("memory://{}", unique("streamed_lossy")))
        .unwrap()
        .with_lossy_encoder();
    let rows = window(4_000, 3_000);
    let err = write(&store, 1, &multipart(), &rows).await.unwrap_err();
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

/// Rows out of order across two pushes, or outside the window, are refused with a typed
/// error naming the row, whatever the piece sizes.
#[tokio::test]
async fn rows_out_of_order_across_pushes_are_refused() {
    let store = ArchiveStore::from_url(&format!("memory://{}", unique("streamed_order"))).unwrap();
    let rows = window(1_000, 0);
    let mut w = store
        .segment_writer(&spec(1), &SegmentUpload::default())
        .unwrap();
    w.push(rows[..500].to_vec()).unwrap();
    let err = w.push(rows[400..401].to_vec()).unwrap_err();
    assert!(
        matches!(&err, ArchiveError::InvalidInput { reason, .. } if reason.contains("row 500 is not after row 499")),
        "{err}"
    );
    let mut w = store
        .segment_writer(&spec(1), &SegmentUpload::default())
        .unwrap();
    let mut outside = rows[0].clone();
    outside.event_time = EventTime::parse_rfc3339("2024-04-01T00:00:00Z").unwrap();
    let err = w.push(vec![outside]).unwrap_err();
    assert!(
        matches!(&err, ArchiveError::InvalidInput { reason, .. } if reason.contains("outside the window")),
        "{err}"
    );
    let err = store
        .segment_writer(&spec(1), &SegmentUpload::default())
        .unwrap()
        .finish()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ArchiveError::InvalidInput { reason, .. } if reason.contains("at least one row")),
        "{err}"
    );
}

/// Large values do not make large row groups: rows are encoded once a megabyte of them is
/// pending, and a group is cut as soon as its encoded size reaches 8 MiB, so a partition of
/// 50 KiB messages spans groups of about 8 MiB (one ranged read each), not one group of the
/// whole partition (a 150 MB group was once read for a latest-50 page).
#[tokio::test]
async fn large_values_are_cut_into_modest_row_groups() {
    for be in backends("streamed_large_values").await {
        // Messages of 50 KiB (incompressible): 1,100 of them, about 55 MB.
        let rows = window(600, 50 << 10);
        let w = write(&be.store, 3, &multipart(), &rows).await.unwrap();
        let m = &w.manifest;
        let largest = m.row_groups.iter().map(|g| g.range.length).max().unwrap();
        assert!(
            m.row_groups.len() >= 6,
            "{}: {} groups",
            be.name,
            m.row_groups.len()
        );
        assert!(
            largest <= 10 << 20,
            "{}: a row group of {largest} bytes",
            be.name
        );
        read_back(&be.store, &w.manifest_key, m, &rows).await;
    }
}
