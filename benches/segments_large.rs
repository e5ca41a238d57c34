//! One busy channel-month in one segment: the segment writer's peak memory, the latest-50
//! page's object reads and bytes, and a full count, against the per-bucket layout of the
//! same rows in the same run (the baseline).
//!
//! `SEGMENTS_LARGE_ROWS` messages (default 10,000,000) of one channel, spread over the 31
//! days of March 2024, are written as one segment to a filesystem archive by the writer the
//! compactor uses (encode, create once, read back, every row group verified through the
//! query reader). Printed:
//!
//! - peak RSS (VmHWM, reset before the write) of the streamed segment write: rows generated
//!   8,192 at a time and pushed into the writer the compactor uses (encoded into a spill
//!   file, uploaded, verified by ranges), so the figure is the writer's, not the harness's;
//! - the latest 50 messages of the channel, nothing cached: object reads and bytes from the
//!   segment, against the same page from the last day's own per-bucket archive;
//! - a count of every row read back from the segment, bucket by bucket, checked against
//!   the rows written.
//!
//! Run: `cargo bench --profile dev-bench --bench segments_large` (or `--profile dev`).

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use pulpitum::archive::{
    ArchiveScan, ArchiveScanMetrics, ArchiveStore, PayloadFormat, SegmentSpec, SegmentUpload,
};
use pulpitum::model::{
    encode_i64, BucketId, BucketKey, BucketStrategy, EventTime, PartitionKey, Record, SortKey,
    TableId,
};

/// Peak resident set size of this process so far, in MiB (Linux `VmHWM`).
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// Row `i` of `n`: one channel, spread evenly over March 2024.
fn row(i: i64, n: i64) -> Record {
    let start = EventTime::parse_rfc3339("2024-03-01T00:00:00Z")
        .unwrap()
        .as_micros();
    let step = 31 * 86_400_000_000i64 / n;
    Record {
        partition_key: PartitionKey::from_i64(42),
        event_time: EventTime::from_micros(start + i * step).unwrap(),
        sort_key: SortKey::new(encode_i64(i).to_vec()).unwrap(),
        value: format!("message {i} of a busy channel").into_bytes(),
    }
}

/// Resets the peak RSS to the current RSS (Linux `clear_refs` 5), so the next reading is
/// the peak of what follows.
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

async fn latest_50(store: &ArchiveStore, key: &str, bucket: &BucketId) -> (usize, u64, u64) {
    let route = store.open_route(key, bucket).await.unwrap();
    let metrics = Arc::new(ArchiveScanMetrics::default());
    let req = ArchiveScan {
        descending: true,
        batch_rows: 50,
        ..ArchiveScan::default()
    };
    let first = store
        .scan_route(&route, bucket, &req, metrics.clone())
        .await
        .unwrap()
        .next()
        .await
        .unwrap()
        .unwrap();
    let s = metrics.snapshot();
    // + 1: the manifest read by `open_route` (not counted by the scan's metrics).
    (first.num_rows(), s.requests + 1, s.bytes_read)
}

fn main() {
    let n: i64 = std::env::var("SEGMENTS_LARGE_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        let store = ArchiveStore::from_url(&url).unwrap();
        let spec = SegmentSpec {
            table_id: TableId::new("chat").unwrap(),
            strategy: BucketStrategy::CalendarDayUtc,
            window: BucketKey::parse_any("month:2024-03").unwrap(),
            generation: 1,
            ordinal: 0,
        };
        // The streamed writer the compactor uses, fed 8,192 rows at a time (as a source
        // scan hands them over): the rows are never all in memory.
        reset_peak();
        let base_rss = peak_rss_mib();
        let t = Instant::now();
        let upload = SegmentUpload {
            spill_dir: Some(dir.path().to_path_buf()),
            ..SegmentUpload::default()
        };
        let mut w = store.segment_writer(&spec, &upload).unwrap();
        let mut i = 0;
        while i < n {
            let to = (i + 8192).min(n);
            w.push((i..to).map(|i| row(i, n)).collect()).unwrap();
            i = to;
        }
        let encode_rss = peak_rss_mib();
        let written = w.finish().await.unwrap();
        let m = &written.manifest;
        println!(
            "segment write (streamed, {n} rows): {:.1} s, {} row groups, {:.1} MiB payload ({}); peak RSS {encode_rss:.0} MiB while encoding, {:.0} MiB through upload and verification (from {base_rss:.0} MiB)",
            t.elapsed().as_secs_f64(),
            m.row_groups.len(),
            m.byte_length as f64 / 1048576.0,
            if m.payload_key.ends_with("/payload.parquet") { "one PUT" } else { "multipart" },
            peak_rss_mib(),
        );
        // Baseline: the last day as its own per-bucket archive (today's layout).
        let last_day = BucketId {
            table_id: spec.table_id.clone(),
            partition_key: PartitionKey::from_i64(42),
            bucket_key: BucketKey::parse_any("day:2024-03-31").unwrap(),
        };
        let day_rows: Vec<Record> = (0..n)
            .rev()
            .map(|i| row(i, n))
            .take_while(|r| last_day.bucket_key.contains(r.event_time))
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let pages: Vec<Result<Vec<Record>, std::convert::Infallible>> =
            day_rows.chunks(8192).map(|c| Ok(c.to_vec())).collect();
        let bucket_archive = store
            .write_bucket(&last_day, 1, PayloadFormat::Parquet, futures::stream::iter(pages))
            .await
            .unwrap();
        let fresh = || ArchiveStore::from_url(&url).unwrap();
        let (rows_b, reads_b, bytes_b) =
            latest_50(&fresh(), &bucket_archive.manifest_key, &last_day).await;
        let (rows_s, reads_s, bytes_s) =
            latest_50(&fresh(), &written.manifest_key, &last_day).await;
        assert_eq!((rows_b, rows_s), (50, 50));
        println!(
            "latest 50, nothing cached: segment {reads_s} reads / {:.2} MiB; per-bucket baseline {reads_b} reads / {:.2} MiB (bytes ratio {:.2}x)",
            bytes_s as f64 / 1048576.0,
            bytes_b as f64 / 1048576.0,
            bytes_s as f64 / bytes_b.max(1) as f64
        );
        // Full count: every bucket of the month read back from the segment.
        let reader = fresh();
        let t = Instant::now();
        let mut count = 0u64;
        for (bucket, want) in m.buckets() {
            let route = reader.open_route(&written.manifest_key, &bucket).await.unwrap();
            let req = ArchiveScan {
                include_value: false,
                ..ArchiveScan::default()
            };
            let mut s = reader
                .scan_route(&route, &bucket, &req, Arc::new(ArchiveScanMetrics::default()))
                .await
                .unwrap();
            let mut got = 0u64;
            while let Some(b) = s.next().await {
                got += b.unwrap().num_rows() as u64;
            }
            assert_eq!(got, want, "{bucket}");
            count += got;
        }
        assert_eq!(count, n as u64);
        println!(
            "full count: {count} rows in {:.1} s (correct); final peak RSS {:.0} MiB",
            t.elapsed().as_secs_f64(),
            peak_rss_mib()
        );
    });
}
