//! Archive write/read benchmark (a plain harness, `harness = false`).
//!
//! 1. Throughput: archive-encode, upload and verify a 1M-row bucket with
//!    `ArchiveStore::write_bucket` (payload upload, full read-back and digest comparison,
//!    verified decode, manifest create and read-back) against writing the same Arrow batches
//!    with the parquet crate's `AsyncArrowWriter` straight to the same store (through
//!    `object_store_opendal` and an `object_store` `BufWriter`, same writer properties).
//!    Both include building the batches from records. Best of two rounds each.
//! 2. Peak heap while writing, and while scanning back, a 5M-row bucket, measured by a
//!    counting global allocator (the fs backend keeps payload bytes out of the heap).
//!
//! `cargo bench --profile dev-bench --bench archive`; env: `PULPITUM_BENCH_ROWS` (1000000),
//! `PULPITUM_BENCH_BIG_ROWS` (5000000), `PULPITUM_BENCH_URL` (a `file://` temp dir; an
//! `s3://` URL uses the AWS variables, see `ArchiveStore::from_url`).

// The page stream's error type is `ArchiveError`, as `write_bucket` requires; its size is the
// archive module's documented choice (it keeps the OpenDAL error whole for retry decisions).
#![allow(clippy::result_large_err)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures::{Stream, StreamExt};
use parquet::arrow::AsyncArrowWriter;
use pulpitum::archive::{
    envelope_schema, records_to_batch, writer_properties, ArchiveError, ArchiveScan, ArchiveStore,
    PayloadFormat, ROW_GROUP_ROWS,
};
use pulpitum::model::{BucketId, BucketKey, EventTime, PartitionKey, Record, SortKey, TableId};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size > layout.size() {
                let d = new_size - layout.size();
                let now = CURRENT.fetch_add(d, Ordering::Relaxed) + d;
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                CURRENT.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn reset_peak() -> usize {
    let now = CURRENT.load(Ordering::Relaxed);
    PEAK.store(now, Ordering::Relaxed);
    now
}

fn mib(b: usize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

const PAGE: usize = 10_000;

fn bucket() -> BucketId {
    BucketId {
        table_id: TableId::new("bench").unwrap(),
        partition_key: PartitionKey::new(b"channel-42".to_vec()).unwrap(),
        bucket_key: BucketKey::parse_any("year:2024").unwrap(),
    }
}

/// Record `i` of the synthetic bucket: a chat-like message (about 100 bytes, partly
/// repetitive text, partly random), a few messages per millisecond.
fn record(b: &BucketId, i: usize) -> Record {
    let start = b.bucket_key.start().as_micros();
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut value =
        format!("user{} says: message number {i} in the channel; ", x % 1000).into_bytes();
    for _ in 0..(20 + i % 60) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        value.push(b'a' + (x % 26) as u8);
    }
    Record {
        partition_key: b.partition_key.clone(),
        event_time: EventTime::from_micros(start + i as i64 * 250).unwrap(),
        sort_key: SortKey::new((i as u64).to_be_bytes().to_vec()).unwrap(),
        value,
    }
}

/// The bucket as a stream of pages generated on the fly (nothing held beyond one page).
fn pages(rows: usize) -> impl Stream<Item = Result<Vec<Record>, ArchiveError>> + Send {
    let b = bucket();
    futures::stream::iter((0..rows).step_by(PAGE))
        .map(move |s| Ok((s..(s + PAGE).min(rows)).map(|i| record(&b, i)).collect()))
}

async fn baseline(store: &ArchiveStore, rows: usize, path: &str) -> (f64, u64) {
    let os = Arc::new(object_store_opendal::OpendalStore::new(
        store.operator().clone(),
    ));
    let t = Instant::now();
    let w = object_store::buffered::BufWriter::new(os, object_store::path::Path::from(path));
    let mut writer = AsyncArrowWriter::try_new(
        w,
        envelope_schema(true),
        Some(writer_properties(ROW_GROUP_ROWS)),
    )
    .unwrap();
    let mut s = std::pin::pin!(pages(rows));
    while let Some(p) = s.next().await {
        let batch = records_to_batch(&p.unwrap(), true);
        writer.write(&batch).await.unwrap();
    }
    writer.close().await.unwrap();
    let secs = t.elapsed().as_secs_f64();
    let len = store.operator().stat(path).await.unwrap().content_length();
    (secs, len)
}

async fn archive(store: &ArchiveStore, rows: usize, generation: i64) -> (f64, u64) {
    let t = Instant::now();
    let w = store
        .write_bucket(&bucket(), generation, PayloadFormat::Parquet, pages(rows))
        .await
        .unwrap();
    (t.elapsed().as_secs_f64(), w.manifest.byte_length)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let rows: usize = std::env::var("PULPITUM_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let big: usize = std::env::var("PULPITUM_BENCH_BIG_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000_000);
    let dir = tempfile::tempdir().unwrap();
    let url = std::env::var("PULPITUM_BENCH_URL")
        .unwrap_or_else(|_| format!("file://{}", dir.path().display()));
    let store = ArchiveStore::from_url(&url).unwrap();
    println!(
        "archive benchmark: store {url}, profile {}",
        if cfg!(debug_assertions) {
            "debug-assertions on"
        } else {
            "optimized"
        }
    );

    // 1. Throughput, best of two alternating rounds.
    let (mut best_b, mut best_a) = (f64::MAX, f64::MAX);
    let (mut len_b, mut len_a) = (0, 0);
    for round in 0..2 {
        let (sb, lb) = baseline(&store, rows, &format!("baseline/r{round}.parquet")).await;
        let (sa, la) = archive(&store, rows, round).await;
        println!(
            "  round {round}: baseline {sb:.2} s ({lb} bytes), archive {sa:.2} s ({la} bytes)"
        );
        if sb < best_b {
            (best_b, len_b) = (sb, lb);
        }
        if sa < best_a {
            (best_a, len_a) = (sa, la);
        }
    }
    let rate = |secs: f64, len: u64| (rows as f64 / secs, len as f64 / 1e6 / secs);
    let (rb, mbb) = rate(best_b, len_b);
    let (ra, mba) = rate(best_a, len_a);
    println!("{rows} rows, payload {:.1} MB", len_a as f64 / 1e6);
    println!("  parquet straight to store: {rb:>12.0} rows/s {mbb:>8.1} MB/s");
    println!("  archive write+verify:      {ra:>12.0} rows/s {mba:>8.1} MB/s");
    println!(
        "  ratio archive/baseline:    {:.2}x (target >= 0.8x)",
        ra / rb
    );

    // 2. Peak heap for a large bucket.
    let base = reset_peak();
    let t = Instant::now();
    let w = store
        .write_bucket(&bucket(), 100, PayloadFormat::Parquet, pages(big))
        .await
        .unwrap();
    let write_peak = PEAK.load(Ordering::Relaxed) - base;
    println!(
        "{big} rows written+verified in {:.1} s ({:.1} MB payload), peak heap {:.1} MiB (target <= 256)",
        t.elapsed().as_secs_f64(),
        w.manifest.byte_length as f64 / 1e6,
        mib(write_peak)
    );
    let base = reset_peak();
    let t = Instant::now();
    let mut s = store
        .scan(&w.manifest, &ArchiveScan::default())
        .await
        .unwrap();
    let mut n = 0usize;
    while let Some(b) = s.next().await {
        n += b.unwrap().num_rows();
    }
    assert_eq!(n, big);
    let read_peak = PEAK.load(Ordering::Relaxed) - base;
    println!(
        "{big} rows scanned back in {:.1} s, peak heap {:.1} MiB (target <= 256)",
        t.elapsed().as_secs_f64(),
        mib(read_peak)
    );
    let desc = ArchiveScan {
        descending: true,
        include_value: true,
        ..ArchiveScan::default()
    };
    let base = reset_peak();
    let mut s = store.scan(&w.manifest, &desc).await.unwrap();
    let mut n = 0usize;
    while let Some(b) = s.next().await {
        n += b.unwrap().num_rows();
    }
    assert_eq!(n, big);
    println!(
        "{big} rows scanned back descending, peak heap {:.1} MiB",
        mib(PEAK.load(Ordering::Relaxed) - base)
    );
}
