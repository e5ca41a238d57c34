//! The write path's safety promises, each against every backend: a damaged write is never
//! returned as a publishable archive (the read-back and decode checks), two writers of
//! different archives for one generation never both win (create-if-absent), the start-up probe
//! refuses a store that overwrites, and an upload that fails or is dropped is aborted.

use super::*;
use pulpitum::archive::WriteError;
use pulpitum::archive::WriteFault;

const WRITE_FAULTS: [WriteFault; 4] = [
    WriteFault::FlipBit,
    WriteFault::Truncate,
    WriteFault::DropChunk,
    WriteFault::Vanish,
];

/// Records whose values are mostly incompressible bytes: in a Parquet payload the value
/// column then fills the middle of the object, far from the key columns and the footer, so
/// the writer's decode check (which reads keys only) never reads the block a fault flips
/// there, and only the whole-payload read-back can notice it.
fn bulky_records(b: &BucketId, n: usize, salt: u8, value_len: usize) -> Vec<Record> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ salt as u64;
    records(b, n, salt)
        .into_iter()
        .map(|mut r| {
            while r.value.len() < value_len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                r.value.extend_from_slice(&x.to_le_bytes());
            }
            r.value.truncate(value_len);
            r
        })
        .collect()
}

/// The typed error each damage must produce when it hits the payload or the manifest.
fn expected_error(be: &str, target: &str, fault: WriteFault, e: &ArchiveError) -> bool {
    use ArchiveError::*;
    let fs = be == "fs";
    match (target, fault) {
        // On S3 a PUT retried after its first attempt was stored (the response lost or late)
        // meets its own damaged object through `If-None-Match: *`; the write cannot tell
        // that object from another writer's and refuses it as different content.
        ("payload", WriteFault::FlipBit) if !fs => {
            matches!(e, ChecksumMismatch { .. } | AlreadyExistsDifferent { .. })
        }
        ("payload", WriteFault::FlipBit) => matches!(e, ChecksumMismatch { .. }),
        ("payload", WriteFault::Truncate | WriteFault::DropChunk) => {
            matches!(e, LengthMismatch { .. })
        }
        // The filesystem's exclusive create already made an empty file.
        ("payload", WriteFault::Vanish) if fs => matches!(e, LengthMismatch { .. }),
        ("payload", WriteFault::Vanish) => matches!(e, NotFound { .. }),
        ("manifest", WriteFault::Vanish) if !fs => matches!(e, NotFound { .. }),
        ("manifest", _) => matches!(e, ChecksumMismatch { .. }),
        _ => false,
    }
}

/// Every write-side fault, on the payload and on the manifest, in both formats: the write
/// fails with the integrity error that names the damage, no manifest that verifies is left
/// for the generation, and a clean retry either converges on the right rows or refuses.
#[tokio::test]
async fn damaged_writes_are_never_returned_as_archives() {
    for be in backends("damage").await {
        // Small verification blocks, so a Parquet payload's value column spans many blocks
        // that the decode check does not read.
        let store = be.store.clone().with_block_size(4096);
        let mut generation = 0;
        for format in FORMATS {
            for target in ["payload", "manifest"] {
                for fault in WRITE_FAULTS {
                    generation += 1;
                    let ctx = format!("{} {format} {target} {fault:?}", be.name);
                    let b = bucket("2024-05-01", 9);
                    let rs = bulky_records(&b, 64, generation as u8, 2048);
                    let filter = if target == "payload" {
                        "/payload."
                    } else {
                        "/manifest.json"
                    };
                    let layer = FaultLayer::new(FaultPlan::new(7).damage_writes(fault, filter));
                    let err = store
                        .with_faults(layer.clone())
                        .write_bucket(&b, generation, format, pages(&rs, 50))
                        .await
                        .map_err(WriteError::into_archive)
                        .map(|w| w.manifest_key)
                        .expect_err(&format!(
                            "{ctx}: a damaged write was returned as an archive"
                        ));
                    assert!(layer.stats().damaged_writes >= 1, "{ctx}: nothing damaged");
                    assert!(
                        expected_error(be.name, target, fault, &err),
                        "{ctx}: unexpected error {err}"
                    );
                    // A damaged manifest may still parse (a flipped bit in a digest's hex or in
                    // `created_at`); whatever it describes must then fail to verify or be the
                    // right rows. Nothing reads it anyway: the write returned no key.
                    let mk = store.manifest_key(&b, generation);
                    if let Ok(m) = store.read_manifest(&mk, &b).await {
                        if let Ok(got) = store.read_all(&m).await {
                            assert_eq!(got, rs, "{ctx}: a stray manifest names wrong rows");
                        }
                    }
                    match store
                        .write_bucket(&b, generation, format, pages(&rs, 50))
                        .await
                        .map_err(WriteError::into_archive)
                    {
                        Ok(w) => assert_eq!(store.read_all(&w.manifest).await.unwrap(), rs),
                        Err(
                            ArchiveError::AlreadyExistsDifferent { .. }
                            | ArchiveError::InvalidManifest { .. },
                        ) => {}
                        Err(e) => panic!("{ctx}: clean retry: {e}"),
                    }
                }
            }
        }
    }
}

/// An encoder that loses a row writes bytes that read back exactly as written: only the
/// decode check (decoded row count against the rows handed in) stops that archive.
#[cfg(feature = "failpoints")]
#[tokio::test]
async fn a_lossy_encoder_is_caught_by_the_decode_check() {
    for be in backends("lossy").await {
        let store = be.store.clone().with_lossy_encoder();
        for (generation, format) in FORMATS.into_iter().enumerate() {
            let b = bucket("2024-05-02", 4);
            let rs = records(&b, 700, 1);
            let err = store
                .write_bucket(&b, generation as i64, format, pages(&rs, 90))
                .await
                .map_err(WriteError::into_archive)
                .map(|w| w.manifest_key)
                .expect_err(&format!(
                    "{} {format}: a lossy payload was accepted",
                    be.name
                ));
            match err {
                ArchiveError::RowCountMismatch {
                    expected, actual, ..
                } => assert_eq!((expected, actual), (700, 699), "{} {format}", be.name),
                e => panic!("{} {format}: unexpected error {e}", be.name),
            }
            let mk = store.manifest_key(&b, generation as i64);
            assert!(
                matches!(
                    store.read_manifest(&mk, &b).await,
                    Err(ArchiveError::NotFound { .. })
                ),
                "{} {format}: a manifest was created",
                be.name
            );
        }
    }
}

/// Two writers with different archives of one generation (a Parquet and a JSON payload, so
/// their payloads do not collide and both reach the manifest) race for the manifest key with
/// nothing else ordering them: in every round exactly one wins, the other sees
/// `AlreadyExistsDifferent`, and the stored manifest is the winner's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_writers_of_different_manifests_exactly_one_wins() {
    for be in backends("manifest-race").await {
        let rounds = if be.name == "s3" { 40 } else { 150 };
        let b = bucket("2024-05-03", 5);
        let rs = records(&b, 40, 2);
        let mut overlapped = 0;
        for generation in 0..rounds {
            let barrier = Arc::new(tokio::sync::Barrier::new(2));
            let tasks: Vec<_> = FORMATS
                .into_iter()
                .map(|format| {
                    let (s, b, rs, barrier) =
                        (be.store.clone(), b.clone(), rs.clone(), barrier.clone());
                    tokio::spawn(async move {
                        barrier.wait().await;
                        let r = s
                            .write_bucket(&b, generation, format, pages(&rs, 40))
                            .await
                            .map_err(WriteError::into_archive);
                        (format, r, std::time::Instant::now())
                    })
                })
                .collect();
            let mut winners = Vec::new();
            let mut finished = Vec::new();
            for t in tasks {
                let (format, r, at) = t.await.unwrap();
                finished.push(at);
                match r {
                    Ok(w) => winners.push((format, w)),
                    Err(ArchiveError::AlreadyExistsDifferent { key }) => {
                        assert_eq!(key, be.store.manifest_key(&b, generation), "{}", be.name)
                    }
                    Err(e) => panic!("{} round {generation}: {format}: {e}", be.name),
                }
            }
            let gap = finished[0].max(finished[1]) - finished[0].min(finished[1]);
            if gap < Duration::from_millis(5) {
                overlapped += 1;
            }
            assert_eq!(
                winners.len(),
                1,
                "{} round {generation}: winners {:?}",
                be.name,
                winners.iter().map(|w| w.0).collect::<Vec<_>>()
            );
            let (format, w) = &winners[0];
            let stored = be.store.read_manifest(&w.manifest_key, &b).await.unwrap();
            assert_eq!(stored.format, *format, "{} round {generation}", be.name);
            assert!(stored.same_archive(&w.manifest));
            assert_eq!(be.store.read_all(&stored).await.unwrap(), rs);
        }
        println!(
            "{}: {rounds} rounds, one winner each; {overlapped} finished within 5 ms of each other",
            be.name
        );
    }
}

/// The start-up probe passes on every real backend and leaves nothing behind; a store that
/// drops the create-if-absent condition is refused with an error naming the store (and no
/// credential).
#[tokio::test]
async fn the_create_once_probe_refuses_a_store_that_overwrites() {
    for be in backends("probe").await {
        be.store
            .check_create_once()
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", be.name));
        let overwriting = be.store.with_faults(FaultLayer::new(
            FaultPlan::new(0).ignore_create_conditions(),
        ));
        let err = overwriting.check_create_once().await.unwrap_err();
        let ArchiveError::CreateOnceUnsupported { store, reason } = &err else {
            panic!("{}: unexpected error {err}", be.name);
        };
        assert!(reason.contains("second conditional create"), "{reason}");
        assert_eq!(store, &be.store.describe());
        let scheme = if be.name == "memory" {
            "memory"
        } else {
            be.name
        };
        assert!(store.starts_with(scheme), "{}: {store}", be.name);
        let text = err.to_string();
        assert!(
            !text.contains("SKTESTSECRET") && !text.contains("AKTEST"),
            "{text}"
        );
        if be.name == "s3" {
            assert!(store.contains("pulpitum-test"), "{store}");
        }
        // Both probes cleaned up after themselves.
        assert_eq!(
            be.store.list_objects().await.unwrap(),
            vec![],
            "{}",
            be.name
        );
    }
}

/// In-progress multipart uploads under `prefix` on the S3 server, listed with a signed
/// `ListMultipartUploads` request (curl signs SigV4; the query must be in canonical order).
fn s3_uploads_in_progress(prefix: &str) -> usize {
    let url = format!(
        "{}/{}?prefix={}%2F&uploads=",
        env_or("PULPITUM_S3_ENDPOINT", "http://127.0.0.1:7480"),
        env_or("PULPITUM_S3_BUCKET", "pulpitum-test"),
        prefix.replace('/', "%2F"),
    );
    let out = std::process::Command::new("curl")
        .args(["-s", "-m", "10", "--aws-sigv4"])
        .arg(format!("aws:amz:{}:s3", env_or("AWS_REGION", "us-east-1")))
        .args(["-H", "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"])
        .arg("--user")
        .arg(format!(
            "{}:{}",
            env_or("AWS_ACCESS_KEY_ID", "AKTEST"),
            env_or("AWS_SECRET_ACCESS_KEY", "SKTESTSECRET")
        ))
        .arg(&url)
        .output()
        .expect("run curl");
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        body.contains("ListMultipartUploadsResult"),
        "listing multipart uploads failed: {body}"
    );
    body.matches("<UploadId>").count()
}

/// What is left of an upload at `key`: whether an object exists there, and (S3) how many
/// multipart uploads are still open under the store's prefix.
async fn leftovers(be: &Backend, key: &str) -> (bool, usize) {
    let exists = be.store.operator().exists(key).await.unwrap();
    let open = if be.name == "s3" {
        s3_uploads_in_progress(be.store.prefix())
    } else {
        0
    };
    (exists, open)
}

/// About 28 MiB of JSON lines, then either an error or a stall. The encoder flushes every
/// 8192 records (about 11 MiB here), and OpenDAL starts a multipart upload with its second
/// 8 MiB chunk, so by then an upload is open on S3 with a part stored. Before ending,
/// the stream checks that an upload really is open (S3) or the file exists (filesystem), so
/// the test cannot pass for want of anything to abort.
fn big_then<F>(
    be: &Backend,
    b: &BucketId,
    key: String,
    end: F,
) -> impl futures::Stream<Item = Result<Vec<Record>, ArchiveError>> + Send + 'static
where
    F: std::future::Future<Output = Result<Vec<Record>, ArchiveError>> + Send + 'static,
{
    let rs = bulky_records(b, 20_000, 3, 1000);
    let (name, prefix, op) = (
        be.name,
        be.store.prefix().to_string(),
        be.store.operator().clone(),
    );
    pages(&rs, 500).chain(futures::stream::once(async move {
        if name == "s3" {
            let open = tokio::task::spawn_blocking(move || s3_uploads_in_progress(&prefix))
                .await
                .unwrap();
            assert_eq!(open, 1, "no multipart upload in progress");
        } else if name == "fs" {
            assert!(op.exists(&key).await.unwrap(), "no partial file");
        }
        end.await
    }))
}

/// An upload that fails part-way (the record source errs), one whose completion fails, and
/// one that is dropped (the write's future is cancelled) leave no object at the payload key
/// and no open multipart upload. (The in-memory service stores nothing before a close, so
/// it has nothing to leave behind and is skipped.)
#[tokio::test]
async fn failed_and_dropped_uploads_are_aborted() {
    for be in backends("abort").await {
        if be.name == "memory" {
            continue;
        }
        let b = bucket("2024-05-04", 6);
        let key = be.store.payload_key(&b, 1, PayloadFormat::Json);
        let failing = big_then(&be, &b, key.clone(), async {
            Err(ArchiveError::Config("snapshot connection lost".into()))
        });
        match be
            .store
            .write_bucket(&b, 1, PayloadFormat::Json, failing)
            .await
        {
            Err(WriteError::Source(ArchiveError::Config(m))) if m == "snapshot connection lost" => {
            }
            other => panic!("{}: {:?}", be.name, other.map(|w| w.manifest_key)),
        }
        assert_eq!(leftovers(&be, &key).await, (false, 0), "{} error", be.name);

        let key = be.store.payload_key(&b, 3, PayloadFormat::Json);
        let layer = FaultLayer::new(FaultPlan::new(3).fail_closes(1));
        let completing = big_then(&be, &b, key.clone(), async { Ok(Vec::new()) });
        match be
            .store
            .with_faults(layer)
            .write_bucket(&b, 3, PayloadFormat::Json, completing)
            .await
            .map_err(WriteError::into_archive)
        {
            Err(ArchiveError::Storage { op: "write", .. }) => {}
            other => panic!("{}: {:?}", be.name, other.map(|w| w.manifest_key)),
        }
        assert_eq!(leftovers(&be, &key).await, (false, 0), "{} close", be.name);

        let key = be.store.payload_key(&b, 2, PayloadFormat::Json);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let stalling = big_then(&be, &b, key.clone(), async move {
            let _ = tx.send(());
            futures::future::pending().await
        });
        let write = be.store.write_bucket(&b, 2, PayloadFormat::Json, stalling);
        tokio::select! {
            r = write => panic!("{}: the stalled write ended: {:?}", be.name, r.map(|w| w.manifest_key)),
            _ = rx => {}
        }
        // The write future is dropped here; its abort runs in a spawned task.
        let mut left = leftovers(&be, &key).await;
        for _ in 0..100 {
            if left == (false, 0) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            left = leftovers(&be, &key).await;
        }
        assert_eq!(left, (false, 0), "{} drop", be.name);
    }
}
