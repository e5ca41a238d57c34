//! The cold tier against every backend it supports: in-memory OpenDAL, the local filesystem,
//! and a real S3 server (radosgw from `scripts/s3-up.sh`; `PULPITUM_S3_ENDPOINT`,
//! `PULPITUM_S3_BUCKET`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION` override
//! the defaults `http://127.0.0.1:7480`, `pulpitum-test`, `AKTEST`, `SKTESTSECRET`,
//! `us-east-1`). Set `PULPITUM_SKIP_S3=1` to run without S3; otherwise an unreachable server
//! fails the tests. Every test writes under its own prefix.

#![allow(clippy::result_large_err)]

use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::BinaryArray;
use futures::StreamExt;
use pulpitum::archive::{
    batches_to_records, ArchiveError, ArchiveScan, ArchiveScanMetrics, ArchiveStore, FaultLayer,
    FaultOp, FaultPlan, Manifest, PayloadFormat, WriteError, WrittenArchive,
};
use pulpitum::model::{
    BucketId, BucketKey, ClusteringKey, EventTime, PartitionKey, Record, ScanBounds, SortKey,
    TableId,
};
use sha2::{Digest, Sha256};

struct Backend {
    name: &'static str,
    store: ArchiveStore,
    _dir: Option<tempfile::TempDir>,
}

static UNIQUE: AtomicU64 = AtomicU64::new(0);

fn unique(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "t/{test}-{nanos}-{}-{}",
        std::process::id(),
        UNIQUE.fetch_add(1, Ordering::SeqCst)
    )
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// The test S3 service with no retry layer: a conditional create's answer is the server's
/// own, never a retry's view of the caller's earlier, half-seen attempt.
fn s3_raw_operator() -> opendal::Operator {
    pulpitum::archive::install_http_transport();
    let b = opendal::services::S3::default()
        .bucket(&env_or("PULPITUM_S3_BUCKET", "pulpitum-test"))
        .root("/")
        .endpoint(&env_or("PULPITUM_S3_ENDPOINT", "http://127.0.0.1:7480"))
        .region(&env_or("AWS_REGION", "us-east-1"))
        .access_key_id(&env_or("AWS_ACCESS_KEY_ID", "AKTEST"))
        .secret_access_key(&env_or("AWS_SECRET_ACCESS_KEY", "SKTESTSECRET"))
        .disable_config_load();
    opendal::Operator::new(b).unwrap()
}

fn s3_store(prefix: &str) -> ArchiveStore {
    pulpitum::archive::install_http_transport();
    let b = opendal::services::S3::default()
        .bucket(&env_or("PULPITUM_S3_BUCKET", "pulpitum-test"))
        .root("/")
        .endpoint(&env_or("PULPITUM_S3_ENDPOINT", "http://127.0.0.1:7480"))
        .region(&env_or("AWS_REGION", "us-east-1"))
        .access_key_id(&env_or("AWS_ACCESS_KEY_ID", "AKTEST"))
        .secret_access_key(&env_or("AWS_SECRET_ACCESS_KEY", "SKTESTSECRET"))
        .disable_config_load();
    // The same retry layer as `ArchiveStore::from_url`: radosgw under load sometimes closes
    // a connection mid-response, a transient error production code retries too.
    let op = opendal::Operator::new(b).unwrap().layer(
        opendal::layers::RetryLayer::new()
            .with_jitter()
            .with_max_times(4),
    );
    ArchiveStore::from_operator(op, prefix)
}

async fn backends(test: &str) -> Vec<Backend> {
    let dir = tempfile::tempdir().unwrap();
    let fs = ArchiveStore::from_url(&format!("file://{}", dir.path().display())).unwrap();
    let mut out = vec![
        Backend {
            name: "memory",
            store: ArchiveStore::from_url(&format!("memory://{}", unique(test))).unwrap(),
            _dir: None,
        },
        Backend {
            name: "fs",
            store: fs,
            _dir: Some(dir),
        },
    ];
    if std::env::var("PULPITUM_SKIP_S3").ok().as_deref() != Some("1") {
        let store = s3_store(&unique(test));
        if let Err(e) = store.operator().list("t/").await {
            panic!(
                "S3 at {} is not reachable ({e}); start it with `bash scripts/s3-up.sh` \
                 or set PULPITUM_SKIP_S3=1",
                env_or("PULPITUM_S3_ENDPOINT", "http://127.0.0.1:7480")
            );
        }
        out.push(Backend {
            name: "s3",
            store,
            _dir: None,
        });
    }
    out
}

fn bucket(day: &str, pk: u8) -> BucketId {
    BucketId {
        table_id: TableId::new("chat").unwrap(),
        partition_key: PartitionKey::new(vec![pk, 0xff]).unwrap(),
        bucket_key: BucketKey::parse_any(&format!("day:{day}")).unwrap(),
    }
}

/// `n` records of `b`, several per microsecond, with sort keys of varying length and values
/// derived from `salt`.
fn records(b: &BucketId, n: usize, salt: u8) -> Vec<Record> {
    let start = b.bucket_key.start().as_micros();
    (0..n)
        .map(|i| {
            let t = start + (i as i64 / 3) * 997 + 11;
            let k = match i % 3 {
                0 => vec![],
                1 => vec![b'k', (i % 251) as u8],
                _ => vec![b'z'; 1 + i % 5],
            };
            Record {
                partition_key: b.partition_key.clone(),
                event_time: EventTime::from_micros(t).unwrap(),
                sort_key: SortKey::new(k).unwrap(),
                value: value(i, salt),
            }
        })
        .collect()
}

/// A value with an incompressible part, so payloads span several verification blocks.
fn value(i: usize, salt: u8) -> Vec<u8> {
    let mut x = (i as u64 + 1).wrapping_mul(6364136223846793005) ^ salt as u64;
    let mut v = format!("value {i} {salt} ").into_bytes();
    for _ in 0..(i % 48) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    v
}

/// Pages of irregular sizes, as a hot-store snapshot would deliver them.
fn pages(
    rs: &[Record],
    page: usize,
) -> impl futures::Stream<Item = Result<Vec<Record>, ArchiveError>> + Send + 'static {
    let chunks: Vec<Result<Vec<Record>, ArchiveError>> =
        rs.chunks(page.max(1)).map(|c| Ok(c.to_vec())).collect();
    futures::stream::iter(chunks)
}

async fn scan_all(
    store: &ArchiveStore,
    m: &Manifest,
    req: &ArchiveScan,
) -> Result<Vec<datafusion::arrow::record_batch::RecordBatch>, ArchiveError> {
    let mut s = store.scan(m, req).await?;
    let mut out = Vec::new();
    while let Some(b) = s.next().await {
        out.push(b?);
    }
    Ok(out)
}

fn keys_of(batches: &[datafusion::arrow::record_batch::RecordBatch]) -> Vec<(i64, Vec<u8>)> {
    use datafusion::arrow::array::{BinaryArray, TimestampNanosecondArray};
    let mut out = Vec::new();
    for b in batches {
        let t = b
            .column(1)
            .as_any()
            .downcast_ref::<TimestampNanosecondArray>()
            .unwrap();
        let k = b.column(2).as_any().downcast_ref::<BinaryArray>().unwrap();
        for i in 0..b.num_rows() {
            out.push((t.value(i) / 1000, k.value(i).to_vec()));
        }
    }
    out
}

const FORMATS: [PayloadFormat; 2] = [PayloadFormat::Parquet, PayloadFormat::Json];

#[tokio::test]
async fn round_trips_in_both_formats_and_retries_idempotently() {
    for be in backends("roundtrip").await {
        let s = &be.store;
        for (i, format) in FORMATS.into_iter().enumerate() {
            let b = bucket("2024-03-10", i as u8);
            let rs = records(&b, 5_000, 1);
            let w = s
                .write_bucket(&b, 3, format, pages(&rs, 777))
                .await
                .map_err(WriteError::into_archive)
                .unwrap();
            assert_eq!(w.manifest_key, s.manifest_key(&b, 3), "{}", be.name);
            assert!(w.manifest_key.contains("v4/chat/"));
            assert!(w.manifest_key.ends_with("/day:2024-03-10/g3/manifest.json"));
            let m = &w.manifest;
            assert_eq!((m.row_count, m.format, m.generation), (5_000, format, 3));
            assert_eq!(m.payload_key, s.payload_key(&b, 3, format));
            assert_eq!(m.min_event_time, Some(rs[0].event_time));
            assert_eq!(m.max_event_time, Some(rs.last().unwrap().event_time));
            let read = s.read_manifest(&w.manifest_key, &b).await.unwrap();
            assert_eq!(&read, m);
            assert_eq!(s.read_all(m).await.unwrap(), rs, "{} {format}", be.name);
            let scanned = scan_all(s, m, &ArchiveScan::default()).await.unwrap();
            assert_eq!(batches_to_records(&scanned).unwrap(), rs);

            // The same snapshot paged differently is the same archive: the retry succeeds
            // and returns the stored manifest.
            let again = s
                .write_bucket(&b, 3, format, pages(&rs, 5000))
                .await
                .map_err(WriteError::into_archive)
                .unwrap();
            assert!(again.manifest.same_archive(m));
            assert_eq!(again.manifest.sha256, m.sha256);
            // Different content under the same generation is refused.
            let other = records(&b, 5_000, 2);
            let err = s
                .write_bucket(&b, 3, format, pages(&other, 777))
                .await
                .map_err(WriteError::into_archive)
                .unwrap_err();
            assert!(
                matches!(err, ArchiveError::AlreadyExistsDifferent { .. }),
                "{}: {err}",
                be.name
            );
            assert_eq!(s.read_all(m).await.unwrap(), rs);
        }
    }
}

#[tokio::test]
async fn empty_buckets_are_valid_archives() {
    for be in backends("empty").await {
        for (g, format) in FORMATS.into_iter().enumerate() {
            let b = bucket("2024-03-11", 9);
            let w = be
                .store
                .write_bucket(&b, g as i64, format, pages(&[], 1))
                .await
                .map_err(WriteError::into_archive)
                .unwrap();
            assert_eq!(w.manifest.row_count, 0);
            assert_eq!(w.manifest.min_event_time, None);
            assert!(
                w.manifest.byte_length > 0,
                "an empty payload still has a header/footer"
            );
            let m = be.store.read_manifest(&w.manifest_key, &b).await.unwrap();
            assert!(be.store.read_all(&m).await.unwrap().is_empty());
            assert!(scan_all(&be.store, &m, &ArchiveScan::default())
                .await
                .unwrap()
                .iter()
                .all(|b| b.num_rows() == 0));
        }
    }
}

#[tokio::test]
async fn writer_rejects_records_that_do_not_belong() {
    let be = &backends("input").await[0];
    let b = bucket("2024-03-10", 1);
    let mut rs = records(&b, 10, 0);
    rs.swap(3, 4);
    let mut wrong_pk = records(&b, 10, 0);
    wrong_pk[5].partition_key = PartitionKey::new(vec![1]).unwrap();
    let mut outside = records(&b, 10, 0);
    outside[9].event_time = b.bucket_key.end();
    for (name, bad) in [("order", rs), ("partition", wrong_pk), ("bucket", outside)] {
        for format in FORMATS {
            let err = be
                .store
                .write_bucket(&b, 1, format, pages(&bad, 4))
                .await
                .map_err(WriteError::into_archive)
                .unwrap_err();
            assert!(
                matches!(err, ArchiveError::InvalidInput { .. }),
                "{name}: {err}"
            );
            let key = be.store.manifest_key(&b, 1);
            assert!(matches!(
                be.store.read_manifest(&key, &b).await,
                Err(ArchiveError::NotFound { .. })
            ));
        }
    }
    // An error from the page stream aborts the write too.
    let failing = futures::stream::iter(vec![
        Ok(records(&b, 3, 0)),
        Err(ArchiveError::Config("snapshot failed".into())),
    ]);
    let err = be
        .store
        .write_bucket(&b, 2, PayloadFormat::Parquet, failing)
        .await
        .map_err(WriteError::into_archive)
        .unwrap_err();
    assert!(matches!(err, ArchiveError::Config(_)));
}

/// Overwrites an object unconditionally (the damage the tests inflict).
async fn put(store: &ArchiveStore, key: &str, bytes: Vec<u8>) {
    store.operator().delete(key).await.unwrap();
    store.operator().write(key, bytes).await.unwrap();
}

async fn get(store: &ArchiveStore, key: &str) -> Vec<u8> {
    store.operator().read(key).await.unwrap().to_vec()
}

/// Writes `payload` and a manifest whose checksums match it, so that decoding (not the
/// checksum) is what is tested.
async fn reseal(store: &ArchiveStore, key: &str, m: &Manifest, payload: Vec<u8>, rows: u64) {
    let mut m = m.clone();
    m.byte_length = payload.len() as u64;
    m.sha256 = hex::encode(Sha256::digest(&payload));
    m.block_sha256 = payload
        .chunks(m.block_size as usize)
        .map(|c| hex::encode(Sha256::digest(c)))
        .collect();
    m.row_count = rows;
    if rows == 0 {
        m.min_event_time = None;
        m.max_event_time = None;
    }
    put(store, &m.payload_key, payload).await;
    put(store, key, m.to_json_bytes()).await;
}

fn edited_manifest(
    bytes: &[u8],
    f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(bytes).unwrap();
    f(v.as_object_mut().unwrap());
    serde_json::to_vec(&v).unwrap()
}

/// Every way an archive can be damaged ends in a typed error; rows returned before a ranged
/// read meets the damage are a correct prefix.
#[tokio::test]
async fn damaged_archives_yield_typed_errors_never_wrong_rows() {
    for be in backends("damage").await {
        let s = &be.store;
        for (fi, format) in FORMATS.into_iter().enumerate() {
            let b = bucket("2024-05-01", 20 + fi as u8);
            let rs = records(&b, 3000, 0);
            let w = s
                .write_bucket(&b, 1, format, pages(&rs, 1000))
                .await
                .map_err(WriteError::into_archive)
                .unwrap();
            let (mk, m) = (w.manifest_key.clone(), w.manifest.clone());
            let good_payload = get(s, &m.payload_key).await;
            let good_manifest = get(s, &mk).await;
            let restore = || async {
                put(s, &m.payload_key, good_payload.clone()).await;
                put(s, &mk, good_manifest.clone()).await;
            };
            let ctx = format!("{} {format}", be.name);

            // Truncated payload.
            put(
                s,
                &m.payload_key,
                good_payload[..good_payload.len() - 100].to_vec(),
            )
            .await;
            let e = s.read_all(&m).await.unwrap_err();
            assert!(matches!(e, ArchiveError::Truncated { .. }), "{ctx}: {e}");
            let e = scan_all(s, &m, &ArchiveScan::default()).await.unwrap_err();
            assert!(matches!(e, ArchiveError::Truncated { .. }), "{ctx}: {e}");

            // One flipped byte.
            let mut flipped = good_payload.clone();
            let at = flipped.len() / 2;
            flipped[at] ^= 1;
            put(s, &m.payload_key, flipped).await;
            let e = s.read_all(&m).await.unwrap_err();
            assert!(
                matches!(e, ArchiveError::ChecksumMismatch { .. }),
                "{ctx}: {e}"
            );
            // The damage is found when the scan opens (footer block) or when it reaches the
            // damaged block; rows returned before that are exact.
            let mut got = Vec::new();
            let mut err = None;
            match s.scan(&m, &ArchiveScan::default()).await {
                Err(e) => err = Some(e),
                Ok(mut stream) => {
                    while let Some(item) = stream.next().await {
                        match item {
                            Ok(b) => got.extend(batches_to_records(&[b]).unwrap()),
                            Err(e) => {
                                err = Some(e);
                                break;
                            }
                        }
                    }
                }
            }
            assert!(
                matches!(err, Some(ArchiveError::ChecksumMismatch { .. })),
                "{ctx}: {err:?}"
            );
            assert_eq!(
                got[..],
                rs[..got.len()],
                "{ctx}: rows before the damage are exact"
            );
            restore().await;

            // Wrong checksum in the manifest.
            let wrong = edited_manifest(&good_manifest, |o| {
                o.insert("sha256".into(), "0".repeat(64).into());
            });
            put(s, &mk, wrong).await;
            let m2 = s.read_manifest(&mk, &b).await.unwrap();
            let e = s.read_all(&m2).await.unwrap_err();
            assert!(
                matches!(e, ArchiveError::ChecksumMismatch { .. }),
                "{ctx}: {e}"
            );
            if format == PayloadFormat::Json {
                // A streamed JSON read checks the whole-object digest too.
                let e = scan_all(s, &m2, &ArchiveScan::default()).await.unwrap_err();
                assert!(
                    matches!(e, ArchiveError::ChecksumMismatch { .. }),
                    "{ctx}: {e}"
                );
            }
            let wrong_block = edited_manifest(&good_manifest, |o| {
                o.insert("block_sha256".into(), serde_json::json!(["1".repeat(64)]));
            });
            put(s, &mk, wrong_block).await;
            let m3 = s.read_manifest(&mk, &b).await.unwrap();
            let e = scan_all(s, &m3, &ArchiveScan::default()).await.unwrap_err();
            assert!(
                matches!(e, ArchiveError::ChecksumMismatch { .. }),
                "{ctx}: {e}"
            );
            restore().await;

            // A manifest naming another bucket, or read for another bucket.
            let e = s
                .read_manifest(&mk, &bucket("2024-05-02", 20 + fi as u8))
                .await
                .unwrap_err();
            assert!(
                matches!(e, ArchiveError::IdentityMismatch { .. }),
                "{ctx}: {e}"
            );
            let moved = edited_manifest(&good_manifest, |o| {
                o.insert("partition_key".into(), "01".into());
            });
            put(s, &mk, moved).await;
            let e = s.read_manifest(&mk, &b).await.unwrap_err();
            assert!(
                matches!(e, ArchiveError::IdentityMismatch { .. }),
                "{ctx}: {e}"
            );

            // Manifest and schema versions.
            for v in [3u32, 5] {
                put(
                    s,
                    &mk,
                    edited_manifest(&good_manifest, |o| {
                        o.insert("manifest_version".into(), v.into());
                    }),
                )
                .await;
                let e = s.read_manifest(&mk, &b).await.unwrap_err();
                assert!(
                    matches!(e, ArchiveError::UnsupportedManifestVersion(x) if x == v),
                    "{ctx}: {e}"
                );
            }
            for v in [1u32, 4] {
                put(
                    s,
                    &mk,
                    edited_manifest(&good_manifest, |o| {
                        o.insert("schema_version".into(), v.into());
                    }),
                )
                .await;
                let e = s.read_manifest(&mk, &b).await.unwrap_err();
                assert!(
                    matches!(e, ArchiveError::UnsupportedSchemaVersion(x) if x == v),
                    "{ctx}: {e}"
                );
            }
            // Invalid manifest JSON and a missing field.
            put(s, &mk, b"{\"manifest_version\":4".to_vec()).await;
            let e = s.read_manifest(&mk, &b).await.unwrap_err();
            assert!(
                matches!(e, ArchiveError::InvalidManifest { .. }),
                "{ctx}: {e}"
            );
            put(
                s,
                &mk,
                edited_manifest(&good_manifest, |o| {
                    o.remove("row_count");
                }),
            )
            .await;
            let e = s.read_manifest(&mk, &b).await.unwrap_err();
            assert!(
                matches!(e, ArchiveError::InvalidManifest { .. }),
                "{ctx}: {e}"
            );
            restore().await;

            // Row count that the payload does not have.
            put(
                s,
                &mk,
                edited_manifest(&good_manifest, |o| {
                    o.insert("row_count".into(), 2999.into());
                }),
            )
            .await;
            let m4 = s.read_manifest(&mk, &b).await.unwrap();
            let e = s.read_all(&m4).await.unwrap_err();
            assert!(
                matches!(e, ArchiveError::RowCountMismatch { .. }),
                "{ctx}: {e}"
            );
            let e = scan_all(s, &m4, &ArchiveScan::default()).await.unwrap_err();
            assert!(
                matches!(e, ArchiveError::RowCountMismatch { .. }),
                "{ctx}: {e}"
            );
            restore().await;

            // Invalid encoding under a matching checksum.
            let garbage = match format {
                PayloadFormat::Parquet => b"PAR1 this is not parquet PAR1".to_vec(),
                PayloadFormat::Json => {
                    let mut p = good_payload.clone();
                    let nl = p.iter().position(|c| *c == b'\n').unwrap();
                    p.splice(nl + 1..nl + 20, b"{\"partition_key\":\"zz".iter().copied());
                    p
                }
            };
            reseal(s, &mk, &m, garbage, 3000).await;
            let m5 = s.read_manifest(&mk, &b).await.unwrap();
            let e = s.read_all(&m5).await.unwrap_err();
            assert!(matches!(e, ArchiveError::Decode { .. }), "{ctx}: {e}");
            let e = scan_all(s, &m5, &ArchiveScan::default()).await.unwrap_err();
            assert!(matches!(e, ArchiveError::Decode { .. }), "{ctx}: {e}");
            restore().await;

            // Missing payload.
            s.delete_object(&m.payload_key).await.unwrap();
            let e = s.read_all(&m).await.unwrap_err();
            assert!(matches!(e, ArchiveError::NotFound { .. }), "{ctx}: {e}");
            let e = scan_all(s, &m, &ArchiveScan::default()).await.unwrap_err();
            assert!(matches!(e, ArchiveError::NotFound { .. }), "{ctx}: {e}");
            restore().await;
            assert_eq!(s.read_all(&m).await.unwrap(), rs, "{ctx}: restored");
        }
    }
}

#[tokio::test]
async fn json_rows_out_of_order_or_from_another_partition_are_rejected() {
    let be = &backends("jsonrows").await[0];
    let s = &be.store;
    let b = bucket("2024-05-03", 4);
    let rs = records(&b, 10, 0);
    let w = s
        .write_bucket(&b, 1, PayloadFormat::Json, pages(&rs, 3))
        .await
        .map_err(WriteError::into_archive)
        .unwrap();
    let payload = String::from_utf8(get(s, &w.manifest.payload_key).await).unwrap();
    let mut lines: Vec<&str> = payload.lines().collect();
    lines.swap(3, 4);
    let swapped = lines.join("\n") + "\n";
    reseal(s, &w.manifest_key, &w.manifest, swapped.into_bytes(), 10).await;
    let m = s.read_manifest(&w.manifest_key, &b).await.unwrap();
    assert!(matches!(
        s.read_all(&m).await,
        Err(ArchiveError::Decode { .. })
    ));
    assert!(matches!(
        scan_all(s, &m, &ArchiveScan::default()).await,
        Err(ArchiveError::Decode { .. })
    ));
    let foreign = payload.replacen(&b.partition_key.to_hex(), "0102", 2);
    reseal(s, &w.manifest_key, &w.manifest, foreign.into_bytes(), 10).await;
    let m = s.read_manifest(&w.manifest_key, &b).await.unwrap();
    assert!(matches!(
        s.read_all(&m).await,
        Err(ArchiveError::Decode { .. })
    ));
}

#[tokio::test]
async fn legacy_raw_json_arrays_stay_readable() {
    for be in backends("legacy").await {
        let s = &be.store;
        let b = bucket("2024-06-01", 5);
        let rs = records(&b, 50, 0);
        let w = s
            .write_bucket(&b, 1, PayloadFormat::Json, pages(&rs, 50))
            .await
            .map_err(WriteError::into_archive)
            .unwrap();
        // A 0.1-era payload: a plain array, hex strings or byte arrays, RFC 3339 or micros.
        let legacy: Vec<serde_json::Value> = rs
            .iter()
            .enumerate()
            .map(|(i, r)| {
                if i % 2 == 0 {
                    serde_json::json!({
                        "partition_key": r.partition_key.to_hex(),
                        "event_time": r.event_time.to_string(),
                        "sort_key": hex::encode(r.sort_key.as_bytes()),
                        "value": hex::encode(&r.value),
                    })
                } else {
                    serde_json::json!({
                        "partition_key": r.partition_key.as_bytes(),
                        "event_time": r.event_time.as_micros(),
                        "sort_key": r.sort_key.as_bytes(),
                        "value": r.value,
                    })
                }
            })
            .collect();
        let bytes = serde_json::to_vec(&legacy).unwrap();
        reseal(s, &w.manifest_key, &w.manifest, bytes, 50).await;
        let m = s.read_manifest(&w.manifest_key, &b).await.unwrap();
        assert_eq!(s.read_all(&m).await.unwrap(), rs, "{}", be.name);
        let req = ArchiveScan {
            descending: true,
            batch_rows: 7,
            ..ArchiveScan::default()
        };
        let got = batches_to_records(&scan_all(s, &m, &req).await.unwrap()).unwrap();
        let mut want = rs.clone();
        want.reverse();
        assert_eq!(got, want);
    }
}

fn bounds_cases(rs: &[Record]) -> Vec<ScanBounds> {
    let t = |i: usize| rs[i].event_time;
    let k = |i: usize| rs[i].sort_key.clone();
    let ck = |i: usize| ClusteringKey {
        event_time: t(i),
        sort_key: k(i),
    };
    let n = rs.len();
    vec![
        ScanBounds::all(),
        ScanBounds {
            time_lower: Bound::Included(t(n / 2)),
            time_upper: Bound::Excluded(t(n / 2 + 700)),
            ..ScanBounds::all()
        },
        ScanBounds {
            time_lower: Bound::Excluded(t(10)),
            time_upper: Bound::Included(t(n - 10)),
            sort_lower: Bound::Included(SortKey::new(b"k".to_vec()).unwrap()),
            sort_upper: Bound::Excluded(SortKey::new(b"z".to_vec()).unwrap()),
            ..ScanBounds::all()
        },
        ScanBounds::all().with_after(ck(n - 500)),
        ScanBounds::all().with_before(ck(300)),
        ScanBounds::all().with_after(ck(1000)).with_before(ck(1900)),
        ScanBounds {
            time_lower: Bound::Included(t(n - 1)),
            ..ScanBounds::all()
        },
        // Contradictory: nothing matches.
        ScanBounds {
            time_lower: Bound::Excluded(t(5)),
            time_upper: Bound::Included(t(5)),
            ..ScanBounds::all()
        },
        ScanBounds {
            sort_lower: Bound::Excluded(SortKey::new(vec![b'z'; 9]).unwrap()),
            ..ScanBounds::all()
        },
    ]
}

async fn check_scans(store: &ArchiveStore, m: &Manifest, rs: &[Record], ctx: &str) {
    for bounds in bounds_cases(rs) {
        for descending in [false, true] {
            for (include_value, batch_rows) in [(true, 4096), (false, 1000), (true, 7)] {
                let req = ArchiveScan {
                    bounds: bounds.clone(),
                    descending,
                    include_value,
                    include_keys: true,
                    batch_rows,
                    value: Default::default(),
                };
                let batches = scan_all(store, m, &req).await.unwrap();
                assert!(batches
                    .iter()
                    .all(|b| b.num_rows() <= batch_rows && b.num_rows() > 0));
                assert!(batches
                    .iter()
                    .all(|b| b.num_columns() == if include_value { 4 } else { 3 }));
                let mut want: Vec<&Record> = rs.iter().filter(|r| bounds.matches(r)).collect();
                if descending {
                    want.reverse();
                }
                if include_value {
                    let got = batches_to_records(&batches).unwrap();
                    let want: Vec<Record> = want.into_iter().cloned().collect();
                    assert!(got == want, "{ctx}: {bounds:?} desc={descending}");
                } else {
                    let got = keys_of(&batches);
                    let want: Vec<(i64, Vec<u8>)> = want
                        .iter()
                        .map(|r| (r.event_time.as_micros(), r.sort_key.as_bytes().to_vec()))
                        .collect();
                    assert!(got == want, "{ctx}: {bounds:?} desc={descending} (keys)");
                }
            }
        }
    }
    // Without event_time and sort_key (unbounded scans only): the same partition keys and
    // values in the same order.
    for descending in [false, true] {
        for (include_value, batch_rows) in [(true, 4096), (false, 1000), (true, 7)] {
            let req = ArchiveScan {
                descending,
                include_value,
                include_keys: false,
                batch_rows,
                ..ArchiveScan::default()
            };
            let batches = scan_all(store, m, &req).await.unwrap();
            let mut want: Vec<&Record> = rs.iter().collect();
            if descending {
                want.reverse();
            }
            let mut got_pk = Vec::new();
            let mut got_values = Vec::new();
            for b in &batches {
                assert!(b.num_rows() <= batch_rows && b.num_rows() > 0);
                let pk = b.column_by_name("partition_key").unwrap();
                let pk = pk.as_any().downcast_ref::<BinaryArray>().unwrap();
                got_pk.extend(pk.iter().map(|v| v.unwrap().to_vec()));
                assert_eq!(b.column_by_name("value").is_some(), include_value);
                if let Some(v) = b.column_by_name("value") {
                    let v = v.as_any().downcast_ref::<BinaryArray>().unwrap();
                    got_values.extend(v.iter().map(|v| v.unwrap().to_vec()));
                }
            }
            let want_pk: Vec<Vec<u8>> = want
                .iter()
                .map(|r| r.partition_key.as_bytes().to_vec())
                .collect();
            assert!(got_pk == want_pk, "{ctx}: without keys desc={descending}");
            if include_value {
                let want_values: Vec<Vec<u8>> = want.iter().map(|r| r.value.clone()).collect();
                assert!(got_values == want_values, "{ctx}: values desc={descending}");
            }
        }
    }
    let bounded = ArchiveScan {
        bounds: bounds_cases(rs)
            .into_iter()
            .find(|b| *b != ScanBounds::all())
            .unwrap(),
        include_keys: false,
        ..ArchiveScan::default()
    };
    assert!(matches!(
        scan_all(store, m, &bounded).await,
        Err(ArchiveError::Config(_))
    ));
}

/// A Parquet payload of another partition under a bucket's manifest (digests resealed to
/// match) is refused whether or not the scan decodes the key columns.
#[tokio::test]
async fn parquet_rows_from_another_partition_are_rejected() {
    let be = &backends("pqforeign").await[0];
    let s = &be.store;
    let mine = bucket("2024-05-03", 4);
    let theirs = bucket("2024-05-03", 5);
    let w = s
        .write_bucket(
            &mine,
            1,
            PayloadFormat::Parquet,
            pages(&records(&mine, 10, 0), 3),
        )
        .await
        .map_err(WriteError::into_archive)
        .unwrap();
    let other = s
        .write_bucket(
            &theirs,
            1,
            PayloadFormat::Parquet,
            pages(&records(&theirs, 10, 0), 3),
        )
        .await
        .map_err(WriteError::into_archive)
        .unwrap();
    let foreign = get(s, &other.manifest.payload_key).await;
    reseal(s, &w.manifest_key, &w.manifest, foreign, 10).await;
    let m = s.read_manifest(&w.manifest_key, &mine).await.unwrap();
    for include_keys in [true, false] {
        for descending in [false, true] {
            let req = ArchiveScan {
                include_keys,
                descending,
                ..ArchiveScan::default()
            };
            match scan_all(s, &m, &req).await {
                Err(ArchiveError::Decode { reason, .. }) => {
                    assert!(reason.contains("row of partition"), "{reason}")
                }
                other => panic!("include_keys={include_keys}: {other:?}"),
            }
        }
    }
}

#[tokio::test]
async fn parquet_scans_prune_and_match_the_reference_filter() {
    for be in backends("scan").await {
        let s = &be
            .store
            .clone()
            .with_row_group_rows(5_000)
            .with_block_size(64 * 1024);
        let b = bucket("2024-07-04", 6);
        let rs = records(&b, 15_000, 0);
        let w = s
            .write_bucket(&b, 2, PayloadFormat::Parquet, pages(&rs, 9_999))
            .await
            .map_err(WriteError::into_archive)
            .unwrap();
        check_scans(s, &w.manifest, &rs, be.name).await;

        // A narrow time range reads a fraction of the object and says what it skipped.
        let metrics = Arc::new(ArchiveScanMetrics::default());
        let req = ArchiveScan {
            bounds: ScanBounds {
                time_lower: Bound::Included(rs[10_002].event_time),
                time_upper: Bound::Included(rs[10_050].event_time),
                ..ScanBounds::all()
            },
            ..ArchiveScan::default()
        };
        let mut st = s
            .scan_with_metrics(&w.manifest, &req, metrics.clone())
            .await
            .unwrap();
        let mut n = 0;
        while let Some(batch) = st.next().await {
            n += batch.unwrap().num_rows();
        }
        assert_eq!(n, rs.iter().filter(|r| req.bounds.matches(r)).count());
        let snap = metrics.snapshot();
        assert_eq!(snap.row_groups_total, 3);
        assert_eq!(snap.row_groups_pruned, 2, "{}: {snap:?}", be.name);
        assert!(snap.pages_pruned > 0, "{}: {snap:?}", be.name);
        assert!(
            snap.bytes_read < w.manifest.byte_length / 2,
            "{}: read {} of {} bytes",
            be.name,
            snap.bytes_read,
            w.manifest.byte_length
        );
        assert_eq!(snap.rows_returned, n as u64);
    }
}

#[tokio::test]
async fn json_scans_match_the_reference_filter() {
    for be in backends("jsonscan").await {
        let b = bucket("2024-07-05", 7);
        let rs = records(&b, 2000, 0);
        let w = be
            .store
            .write_bucket(&b, 2, PayloadFormat::Json, pages(&rs, 999))
            .await
            .map_err(WriteError::into_archive)
            .unwrap();
        assert!(w.manifest.block_sha256.len() == 1);
        check_scans(&be.store, &w.manifest, &rs, be.name).await;
    }
}

/// Writes `rs` with 16 KiB verification blocks, checking that the payload spans several;
/// returns the store with that block size and what it wrote.
async fn write_multi_block(
    store: &ArchiveStore,
    b: &BucketId,
    rs: &[Record],
    format: PayloadFormat,
) -> (ArchiveStore, WrittenArchive) {
    let store = store.clone().with_block_size(16 * 1024);
    let w = store
        .write_bucket(b, 1, format, pages(rs, 4096))
        .await
        .map_err(WriteError::into_archive)
        .unwrap();
    assert!(
        w.manifest.block_sha256.len() > 3,
        "{}",
        w.manifest.byte_length
    );
    (store, w)
}

/// A payload opened once keeps its verified footer: scanning it again skips the length
/// check and the footer read, returns the same rows, and still verifies every data block
/// it reads (damage in a data block is found after the footer was cached).
#[tokio::test]
async fn reopened_parquet_payloads_reuse_the_verified_footer() {
    for be in backends("footer").await {
        let b = bucket("2024-07-09", 9);
        let rs = records(&b, 6_000, 3);
        let (store, w) = write_multi_block(&be.store, &b, &rs, PayloadFormat::Parquet).await;
        let scan = |req: ArchiveScan| {
            let store = store.clone();
            let m = w.manifest.clone();
            async move {
                let metrics = Arc::new(ArchiveScanMetrics::default());
                let mut s = store.scan_with_metrics(&m, &req, metrics.clone()).await?;
                let mut out = Vec::new();
                while let Some(b) = s.next().await {
                    out.push(b?);
                }
                Ok::<_, ArchiveError>((out, metrics.requests.load(Ordering::SeqCst)))
            }
        };
        let (first, first_requests) = scan(ArchiveScan::default()).await.unwrap();
        let (again, again_requests) = scan(ArchiveScan::default()).await.unwrap();
        assert_eq!(batches_to_records(&first).unwrap(), rs, "{}", be.name);
        assert_eq!(batches_to_records(&again).unwrap(), rs, "{}", be.name);
        assert!(
            again_requests < first_requests,
            "{}: {again_requests} requests again vs {first_requests} the first time",
            be.name
        );
        // Flip one byte in the first block (data pages; the footer sits at the end).
        let mut payload = get(&store, &w.manifest.payload_key).await;
        payload[100] ^= 0xff;
        put(&store, &w.manifest.payload_key, payload).await;
        match scan(ArchiveScan::default()).await {
            Err(ArchiveError::ChecksumMismatch { .. }) => {}
            other => panic!("{}: damage after caching the footer: {other:?}", be.name),
        }
    }
}

#[tokio::test]
async fn a_multi_block_json_payload_streams() {
    let be = &backends("jsonbig").await[0];
    let b = bucket("2024-07-06", 8);
    let rs = records(&b, 4_000, 0);
    let (store, w) = write_multi_block(&be.store, &b, &rs, PayloadFormat::Json).await;
    let got = batches_to_records(
        &scan_all(&store, &w.manifest, &ArchiveScan::default())
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(got, rs);
}

/// Under injected faults, a write either returns a verified manifest key or an error; no
/// manifest ever names a payload that fails verification; a clean retry converges.
#[tokio::test]
async fn writes_under_faults_never_publish_a_bad_payload() {
    for be in backends("faults").await {
        let seeds: u64 = if be.name == "s3" { 12 } else { 30 };
        let (mut ok, mut failed, mut retried_ok) = (0, 0, 0);
        for seed in 0..seeds {
            let format = FORMATS[(seed % 2) as usize];
            let b = bucket("2024-08-01", (seed % 200) as u8);
            let rs = records(&b, 600 + seed as usize * 17, seed as u8);
            let generation = seed as i64;
            // Fault rates rise with the seed (seed % 5 == 0 injects only latency and lost
            // responses), so the run covers clean, lightly and heavily disturbed writes.
            let rate = 0.02 * (seed % 5) as f64;
            let layer = FaultLayer::new(
                FaultPlan::new(seed)
                    .fail_ratio(FaultOp::Write, rate)
                    .fail_ratio(FaultOp::Read, rate)
                    .fail_ratio(FaultOp::Stat, rate)
                    .ambiguous_writes(seed % 3 / 2)
                    .corrupt_reads(rate / 2.0)
                    .latency(Duration::from_millis(if be.name == "s3" { 0 } else { 1 })),
            );
            let faulty = be.store.with_faults(layer.clone());
            let result = faulty
                .write_bucket(&b, generation, format, pages(&rs, 100))
                .await
                .map_err(WriteError::into_archive);
            let mk = be.store.manifest_key(&b, generation);
            match &result {
                Ok(w) => {
                    ok += 1;
                    assert_eq!(w.manifest_key, mk);
                }
                Err(_) => failed += 1,
            }
            // Whatever happened, a manifest in the store names a payload that verifies.
            match be.store.read_manifest(&mk, &b).await {
                Ok(m) => assert_eq!(
                    be.store.read_all(&m).await.unwrap(),
                    rs,
                    "{} seed {seed}",
                    be.name
                ),
                Err(ArchiveError::NotFound { .. }) => assert!(result.is_err()),
                // On a filesystem the manifest's create and its bytes are two steps: a write
                // failing between them leaves an empty file that readers reject and nothing
                // publishes (the write returned an error).
                Err(ArchiveError::InvalidManifest { .. }) if be.name == "fs" => {
                    assert!(result.is_err())
                }
                Err(e) => panic!("{} seed {seed}: stored manifest invalid: {e}", be.name),
            }
            // A clean retry of the same generation converges on the same archive (on the
            // filesystem a write cut off mid-way leaves a partial payload in place, and the
            // retry then reports it instead of overwriting it).
            match be
                .store
                .write_bucket(&b, generation, format, pages(&rs, 300))
                .await
                .map_err(WriteError::into_archive)
            {
                Ok(w) => {
                    retried_ok += 1;
                    assert_eq!(be.store.read_all(&w.manifest).await.unwrap(), rs);
                    if let Ok(first) = &result {
                        assert!(w.manifest.same_archive(&first.manifest));
                    }
                }
                Err(
                    ArchiveError::AlreadyExistsDifferent { .. }
                    | ArchiveError::InvalidManifest { .. },
                ) if be.name == "fs" => {}
                Err(e) => panic!("{} seed {seed}: clean retry failed: {e}", be.name),
            }
        }
        println!(
            "{}: {ok} verified, {failed} failed, {retried_ok} clean retries converged",
            be.name
        );
        assert!(
            ok > 0 && failed > 0,
            "{}: the plan must both pass and fail writes ({ok}/{failed})",
            be.name
        );
    }
}

#[tokio::test]
async fn an_ambiguous_manifest_create_is_resolved_by_the_retry() {
    for be in backends("ambiguous").await {
        let b = bucket("2024-08-02", 1);
        let rs = records(&b, 500, 0);
        // Payload and manifest both commit, and both responses are "lost".
        // The first attempt loses the payload's response, the second the manifest's; the
        // third finds both objects identical and succeeds without writing anything.
        let layer = FaultLayer::new(FaultPlan::new(1).ambiguous_writes(2));
        let faulty = be.store.with_faults(layer.clone());
        let mut attempts = 0;
        let w = loop {
            attempts += 1;
            match faulty
                .write_bucket(&b, 1, PayloadFormat::Parquet, pages(&rs, 100))
                .await
                .map_err(WriteError::into_archive)
            {
                Ok(w) => break w,
                Err(e) => {
                    assert!(e.is_retryable(), "{}: {e}", be.name);
                    assert!(attempts < 3, "{}: {e}", be.name);
                }
            }
        };
        assert_eq!(attempts, 3, "{}", be.name);
        assert_eq!(layer.stats().ambiguous_writes, 2);
        assert_eq!(be.store.read_all(&w.manifest).await.unwrap(), rs);
    }
}

/// 16 concurrent creators of one manifest key: exactly one conditional create wins, and the
/// stored object is the winner's. Then 16 archivers racing on one generation with different
/// snapshots: exactly one succeeds and the archive holds its rows.
#[tokio::test]
async fn sixteen_concurrent_creators_exactly_one_wins() {
    for be in backends("race").await {
        let s = be.store.clone();
        let b = bucket("2024-09-01", 3);
        let key = s.manifest_key(&b, 99);
        // Raw creates go straight to the service: through a retry layer, a winner whose
        // response was lost in transit retries and is refused by its own object, which is the
        // ambiguity `write_bucket` resolves by reading back, not what this race measures.
        let raw = if be.name == "s3" {
            s3_raw_operator()
        } else {
            s.operator().clone()
        };
        let tasks: Vec<_> = (0..16u8)
            .map(|i| {
                let op = raw.clone();
                let key = key.clone();
                tokio::spawn(async move {
                    let body = format!("{{\"creator\": {i}}}").into_bytes();
                    (i, op.write_with(&key, body).if_not_exists(true).await)
                })
            })
            .collect();
        let mut winners = Vec::new();
        let mut unsure = Vec::new();
        for t in tasks {
            let (i, r) = t.await.unwrap();
            match r {
                Ok(_) => winners.push(i),
                Err(e) if e.kind() == opendal::ErrorKind::ConditionNotMatch => {}
                // A connection the server closed mid-answer: the create may or may not have
                // happened. Only a transient failure may leave that doubt.
                Err(e) => {
                    assert!(e.is_temporary(), "{}: {e}", be.name);
                    unsure.push(i);
                }
            }
        }
        let stored = get(&s, &key).await;
        let stored: serde_json::Value = serde_json::from_slice(&stored).unwrap();
        let creator = stored["creator"].as_u64().unwrap() as u8;
        // Exactly one create took effect: the stored body is one creator's, and that creator
        // is the only one told it won (or, after a lost answer, told nothing certain).
        assert!(winners.len() <= 1, "{}: winners {winners:?}", be.name);
        if winners.is_empty() {
            assert!(unsure.contains(&creator), "{}: nobody won", be.name);
        } else {
            assert_eq!(winners, vec![creator], "{}", be.name);
        }
        assert!(unsure.len() < 8, "{}: {unsure:?} of 16 unsure", be.name);

        let tasks: Vec<_> = (0..16u8)
            .map(|i| {
                let s = s.clone();
                let b = b.clone();
                tokio::spawn(async move {
                    let rs = records(&b, 300, i);
                    let r = s
                        .write_bucket(&b, 7, PayloadFormat::Parquet, pages(&rs, 64))
                        .await
                        .map_err(WriteError::into_archive);
                    (rs, r)
                })
            })
            .collect();
        let mut won = Vec::new();
        for t in tasks {
            let (rs, r) = t.await.unwrap();
            match r {
                Ok(w) => won.push((rs, w)),
                Err(ArchiveError::AlreadyExistsDifferent { .. }) => {}
                Err(e) => panic!("{}: unexpected race error {e}", be.name),
            }
        }
        assert_eq!(won.len(), 1, "{}", be.name);
        let (rs, w) = &won[0];
        let m = s.read_manifest(&w.manifest_key, &b).await.unwrap();
        assert_eq!(&s.read_all(&m).await.unwrap(), rs);
    }
}

#[tokio::test]
async fn objects_are_listed_and_deleted_for_gc() {
    for be in backends("gc").await {
        let s = &be.store;
        let b = bucket("2024-10-01", 2);
        let w = s
            .write_bucket(&b, 1, PayloadFormat::Json, pages(&records(&b, 10, 0), 10))
            .await
            .map_err(WriteError::into_archive)
            .unwrap();
        let objs = s.list_objects().await.unwrap();
        let keys: Vec<&str> = objs.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(
            keys,
            vec![w.manifest_key.as_str(), w.manifest.payload_key.as_str()],
            "{}",
            be.name
        );
        assert_eq!(objs[1].size, w.manifest.byte_length);
        // The GC needs ages; the in-memory service keeps none.
        if be.name != "memory" {
            assert!(
                objs.iter().all(|o| o.last_modified.is_some()),
                "{}",
                be.name
            );
        }
        s.delete_object(&w.manifest.payload_key).await.unwrap();
        s.delete_object(&w.manifest.payload_key).await.unwrap();
        assert_eq!(s.list_objects().await.unwrap().len(), 1);
    }
}

/// The Parquet payload is standard Parquet: DataFusion reads it through an object_store
/// bridge to the same OpenDAL operator.
#[tokio::test]
async fn datafusion_reads_the_payload() {
    use datafusion::prelude::SessionContext;
    for be in backends("datafusion").await {
        let s = &be.store.clone().with_row_group_rows(2_000);
        let b = bucket("2024-11-01", 1);
        let rs = records(&b, 7_000, 0);
        let w = s
            .write_bucket(&b, 1, PayloadFormat::Parquet, pages(&rs, 10_000))
            .await
            .map_err(WriteError::into_archive)
            .unwrap();
        let ctx = SessionContext::new();
        let url = url::Url::parse("archive://store").unwrap();
        let store = object_store_opendal::OpendalStore::new(s.operator().clone());
        ctx.register_object_store(&url, Arc::new(store));
        let path = format!("archive://store/{}", w.manifest.payload_key);
        ctx.register_parquet("t", &path, Default::default())
            .await
            .unwrap();
        let df = ctx
            .sql("SELECT count(*), min(event_time), max(event_time), count(DISTINCT value) FROM t")
            .await
            .unwrap();
        let batches = df.collect().await.unwrap();
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string();
        assert!(text.contains("| 7000 "), "{}: {text}", be.name);
        assert!(
            text.contains("| 7000 ") && text.matches("7000").count() == 2,
            "{}: {text}",
            be.name
        );
        assert!(text.contains(
            &rs[0]
                .event_time
                .to_datetime()
                .format("%Y-%m-%dT%H:%M:%S")
                .to_string()
        ));
    }
}

/// A payload larger than one upload chunk (8 MiB) goes up as a multipart upload on S3 and is
/// verified like any other.
#[tokio::test]
async fn a_payload_larger_than_one_upload_chunk_round_trips() {
    for be in backends("multipart").await {
        if be.name == "fs" {
            continue;
        }
        let b = bucket("2024-12-01", 1);
        let rs: Vec<Record> = records(&b, 60_000, 0)
            .into_iter()
            .map(|mut r| {
                r.value.resize(80, 7);
                r
            })
            .collect();
        let w = be
            .store
            .write_bucket(&b, 1, PayloadFormat::Json, pages(&rs, 8192))
            .await
            .map_err(WriteError::into_archive)
            .unwrap();
        assert!(
            w.manifest.byte_length > 9 << 20,
            "{}",
            w.manifest.byte_length
        );
        assert_eq!(
            be.store.read_all(&w.manifest).await.unwrap().len(),
            rs.len()
        );
    }
}

#[path = "archive/columnar.rs"]
mod columnar;
#[path = "archive/segments.rs"]
mod segments;
#[path = "archive/streamed.rs"]
mod streamed;
#[path = "archive/write_safety.rs"]
mod write_safety;
