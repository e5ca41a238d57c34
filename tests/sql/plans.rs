//! Plan snapshots (logical and physical) of representative queries over the generated
//! dataset, plus plan properties asserted directly: no `SortExec` where the scan is already
//! ordered, sort and limit pushed into the scan for "latest N", pruning before I/O.

use datafusion::arrow::array::StringArray;
use pulpitum::session::SessionOptions;

use crate::common::*;
use crate::dataset;

/// The plan text of an EXPLAIN, one section per plan type.
async fn explain(env: &Env, sql: &str) -> String {
    explain_as(env, "EXPLAIN", sql).await
}

/// The plan text of an `EXPLAIN` variant, unpadded (so masked values cannot shift columns).
async fn explain_as(env: &Env, explain: &str, sql: &str) -> String {
    let batches = env.sql(&format!("{explain} {sql}")).await;
    let mut out = String::new();
    for b in &batches {
        let kinds = b.column(0).as_any().downcast_ref::<StringArray>().unwrap();
        let plans = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
        for i in 0..b.num_rows() {
            out.push_str(&format!("{}:\n{}\n", kinds.value(i), plans.value(i)));
        }
    }
    out
}

fn settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    // Metrics of EXPLAIN ANALYZE carry timings and sizes that vary run to run.
    s.add_filter(r"elapsed_compute=[0-9.]+[a-zµ]*", "elapsed_compute=[time]");
    s.add_filter(
        r"(output_bytes|hot_bytes|archived_bytes|archived_object_bytes)=[0-9.]+ ?[A-Za-z]*",
        "$1=[bytes]",
    );
    s.add_filter(
        r"(time_elapsed_[a-z_]+|output_batches)=[0-9.]+[a-zµ]*",
        "$1=[n]",
    );
    // BufferExec's high-water marks depend on scheduling.
    s.add_filter(r"max_mem_used=[0-9.]+ ?[A-Za-z]*", "max_mem_used=[bytes]");
    s.add_filter(r"max_queued=[0-9]+", "max_queued=[n]");
    // Manifests read by an earlier query of the same session are cached.
    s.add_filter(r"archived_object_reads=[0-9]+", "archived_object_reads=[n]");
    s
}

async fn plan_env() -> Env {
    let opts = SessionOptions {
        target_partitions: Some(4),
        ..SessionOptions::default()
    };
    let env = Env::with_options("plans", opts).await;
    dataset::load(&env, 7).await;
    // A known message in a day of its own, for the one-bucket range query.
    env.sql("INSERT INTO chat VALUES (1, TIMESTAMP '2024-03-01T12:00:00Z', 777777, 'planted')")
        .await;
    // And one in a day of its own that is then archived (hot rows cleaned up).
    env.sql("INSERT INTO chat VALUES (1, TIMESTAMP '2024-03-05T12:00:00Z', 777778, 'planted')")
        .await;
    let planted = pulpitum::model::BucketId {
        table_id: pulpitum::model::TableId::new("chat").unwrap(),
        partition_key: pulpitum::model::PartitionKey::new(pulpitum::model::encode_i64(1).to_vec())
            .unwrap(),
        bucket_key: pulpitum::model::BucketStrategy::CalendarDayUtc
            .bucket_of(pulpitum::model::EventTime::parse_rfc3339("2024-03-05T00:00:00Z").unwrap()),
    };
    let mut loaded = dataset::Loaded::default();
    dataset::archive(
        &env,
        &planted,
        pulpitum::archive::PayloadFormat::Parquet,
        true,
        &mut loaded,
    )
    .await;
    env
}

const QUERIES: [(&str, &str); 16] = [
    ("point_channel", "SELECT * FROM chat WHERE channel_id = 42"),
    ("point_channel_ordered", "SELECT * FROM chat WHERE channel_id = 42 ORDER BY timestamp, id"),
    (
        "range_inside_one_bucket",
        "SELECT id, content FROM chat WHERE channel_id = 1 AND timestamp >= TIMESTAMP '2024-03-01T06:00:00Z' AND timestamp < TIMESTAMP '2024-03-01T18:00:00Z'",
    ),
    (
        "range_across_tiers",
        "SELECT id, timestamp FROM chat WHERE channel_id = 1 AND timestamp BETWEEN TIMESTAMP '2023-06-01T00:00:00Z' AND TIMESTAMP '2024-06-01T00:00:00Z' ORDER BY timestamp, id",
    ),
    (
        "cursor_forward",
        "SELECT * FROM chat WHERE channel_id = 1 AND (timestamp > TIMESTAMP '2024-01-10T12:00:00Z' OR (timestamp = TIMESTAMP '2024-01-10T12:00:00Z' AND id > 500)) ORDER BY timestamp, id LIMIT 50",
    ),
    (
        "cursor_backward",
        "SELECT * FROM chat WHERE channel_id = 1 AND (timestamp < TIMESTAMP '2024-01-10T12:00:00Z' OR (timestamp = TIMESTAMP '2024-01-10T12:00:00Z' AND id < 500)) ORDER BY timestamp DESC, id DESC LIMIT 50",
    ),
    ("latest_page", "SELECT * FROM chat WHERE channel_id = 1 ORDER BY timestamp DESC, id DESC LIMIT 50"),
    (
        "no_channel_time_range",
        "SELECT channel_id, id FROM chat WHERE timestamp >= TIMESTAMP '2024-12-01T00:00:00Z'",
    ),
    (
        "no_channel_ordered_limit",
        "SELECT * FROM chat WHERE timestamp >= TIMESTAMP '2024-06-01T00:00:00Z' ORDER BY timestamp, id LIMIT 10",
    ),
    ("aggregate_one_channel", "SELECT count(*), min(timestamp), max(timestamp) FROM chat WHERE channel_id = -7"),
    ("group_by_channel", "SELECT channel_id, count(*) FROM chat GROUP BY channel_id ORDER BY channel_id"),
    ("in_list", "SELECT channel_id, id FROM chat WHERE channel_id IN (1, 42) AND id < 0"),
    ("unsupported_filter", "SELECT id FROM chat WHERE channel_id = 1 AND content LIKE '%hello%'"),
    ("contradiction", "SELECT * FROM chat WHERE channel_id = 1 AND timestamp > TIMESTAMP '2024-01-02T00:00:00Z' AND timestamp < TIMESTAMP '2024-01-01T00:00:00Z'"),
    (
        "insert_values",
        "INSERT INTO chat VALUES (1, TIMESTAMP '2026-01-01T00:00:00Z', 1, 'new')",
    ),
    (
        "insert_select",
        "INSERT INTO chat SELECT channel_id + 1000, timestamp, id, content FROM chat WHERE channel_id = 1 AND timestamp >= TIMESTAMP '2024-12-01T00:00:00Z'",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_snapshots() {
    let env = plan_env().await;
    let settings = settings();
    for (name, sql) in QUERIES {
        let text = explain(&env, sql).await;
        settings.bind(|| insta::assert_snapshot!(name, text, sql));
    }

    // EXPLAIN ANALYZE of the latest page, with timings and sizes masked.
    let text = explain_as(&env, "EXPLAIN ANALYZE", QUERIES[6].1).await;
    settings.bind(|| insta::assert_snapshot!("analyze_latest_page", text));

    // Ordered by (timestamp, id) on one channel: the scan's declared ordering removes the sort.
    let text = explain(&env, QUERIES[1].1).await;
    assert!(!text.contains("SortExec"), "{text}");
    // Latest page: sort and limit pushed into a descending scan.
    let text = explain(&env, QUERIES[6].1).await;
    assert!(!text.contains("SortExec"), "{text}");
    assert!(text.contains("order=desc, limit=50"), "{text}");
    // A cursor page keeps LIMIT in the scan (every filter is Exact).
    let text = explain(&env, QUERIES[4].1).await;
    assert!(
        text.contains("limit=50") && !text.contains("FilterExec"),
        "{text}"
    );
    // An unsupported filter stays above the scan.
    let text = explain(&env, QUERIES[12].1).await;
    assert!(text.contains("FilterExec"), "{text}");
    env.cleanup().await;
}

/// Reads a named counter from an EXPLAIN ANALYZE text (summed over partitions by DataFusion).
fn metric(text: &str, name: &str) -> u64 {
    let at = text
        .find(&format!("{name}="))
        .unwrap_or_else(|| panic!("{name} missing in {text}"));
    text[at + name.len() + 1..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_page_reads_only_the_newest_buckets_and_analyze_reports_tiers() {
    let env = plan_env().await;
    // Channel 1 has ~90 buckets; the newest 3 rows live in at most 3 buckets.
    let sql = "SELECT * FROM chat WHERE channel_id = 1 ORDER BY timestamp DESC, id DESC LIMIT 3";
    let text = explain_analyze(&env, sql).await;
    let buckets = metric(&text, "hot_buckets") + metric(&text, "archived_buckets");
    assert!(
        (1..=3).contains(&buckets),
        "read {buckets} buckets:\n{text}"
    );
    assert_eq!(
        metric(&text, "hot_rows") + metric(&text, "archived_rows"),
        3,
        "{text}"
    );

    // A whole-channel scan touches every tier and reports each.
    let text = explain_analyze(&env, "SELECT count(*) FROM chat WHERE channel_id = 1").await;
    assert!(
        metric(&text, "hot_buckets") > 0 && metric(&text, "archived_buckets") > 0,
        "{text}"
    );
    assert!(
        metric(&text, "hot_pages") >= metric(&text, "hot_buckets"),
        "{text}"
    );
    assert!(
        metric(&text, "hot_bytes") > 0 && metric(&text, "archived_bytes") > 0,
        "{text}"
    );
    // The object store's side: every archived bucket's payload was fetched, by at least one
    // request each, and more bytes came over the wire than the decoded rows' keys alone.
    assert!(
        metric(&text, "archived_object_reads") >= metric(&text, "archived_buckets"),
        "{text}"
    );
    assert!(metric(&text, "archived_object_bytes") > 0, "{text}");
    // Parquet payloads report their row groups (JSON ones have none).
    assert!(metric(&text, "archived_row_groups") > 0, "{text}");

    // A range that holds only a hot bucket reads no archive object; one that holds only an
    // archived bucket sends no read to the hot store (its route came with the listing).
    let text = explain_analyze(
        &env,
        "SELECT * FROM chat WHERE channel_id = 1 AND timestamp >= TIMESTAMP '2024-03-01T00:00:00Z' AND timestamp < TIMESTAMP '2024-03-02T00:00:00Z'",
    )
    .await;
    assert_eq!(
        (
            metric(&text, "hot_buckets"),
            metric(&text, "archived_buckets")
        ),
        (1, 0),
        "{text}"
    );
    assert_eq!(metric(&text, "archived_batches"), 0, "{text}");
    assert_eq!(
        (
            metric(&text, "archived_object_reads"),
            metric(&text, "archived_object_bytes")
        ),
        (0, 0),
        "{text}"
    );
    let text = explain_analyze(
        &env,
        "SELECT * FROM chat WHERE channel_id = 1 AND timestamp >= TIMESTAMP '2024-03-05T00:00:00Z' AND timestamp < TIMESTAMP '2024-03-06T00:00:00Z'",
    )
    .await;
    assert_eq!(
        (metric(&text, "hot_pages"), metric(&text, "archived_rows")),
        (0, 1),
        "{text}"
    );

    // A range that misses every bucket reads nothing at all.
    let text = explain_analyze(
        &env,
        "SELECT * FROM chat WHERE timestamp > TIMESTAMP '2030-01-01T00:00:00Z'",
    )
    .await;
    assert!(
        text.contains("buckets=[hot=0, archiving=0, archived=0"),
        "{text}"
    );
    assert_eq!(metric(&text, "hot_pages"), 0, "{text}");
    env.cleanup().await;
}

async fn explain_analyze(env: &Env, sql: &str) -> String {
    let batches = env.sql(&format!("EXPLAIN ANALYZE {sql}")).await;
    pretty(&batches)
}

/// `(channel_id, timestamp in µs, id)` of every row of `batches`, in their order.
fn keyed_rows(batches: &[datafusion::arrow::record_batch::RecordBatch]) -> Vec<(i64, i64, i64)> {
    use datafusion::arrow::array::{Int64Array, TimestampMicrosecondArray};
    let mut out = Vec::new();
    for b in batches {
        let ch = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        let t = b
            .column(1)
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .unwrap();
        let id = b.column(2).as_any().downcast_ref::<Int64Array>().unwrap();
        for i in 0..b.num_rows() {
            out.push((ch.value(i), t.value(i), id.value(i)));
        }
    }
    out
}

/// The newest (and the oldest) rows across channels: no channel's order answers them, so a
/// TopK stays above the scan; the scan reads each channel in the TopK's direction and skips
/// every bucket the TopK's filter rejects once it holds its rows. The page read a fraction
/// of the buckets a full scan reads, and is the page the whole table sorted gives. With one
/// scan partition for all four channels the partition's rows are in no time order, so the
/// TopK cannot stop it early: only the skipping keeps it from reading everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_across_channels_skips_the_buckets_its_topk_rejects() {
    let env = plan_env().await;
    let every = keyed_rows(&env.sql("SELECT channel_id, timestamp, id FROM chat").await);
    let full = explain_analyze(&env, "SELECT count(id) FROM chat").await;
    let total = metric(&full, "hot_buckets") + metric(&full, "archived_buckets");
    for (order, newest, partitions) in [
        ("DESC", true, 4),
        ("ASC", false, 4),
        ("DESC", true, 1),
        ("ASC", false, 1),
    ] {
        env.sql(&format!(
            "SET datafusion.execution.target_partitions = {partitions}"
        ))
        .await;
        let sql = format!(
            "SELECT channel_id, timestamp, id FROM chat ORDER BY timestamp {order}, id {order} LIMIT 10"
        );
        let mut want = every.clone();
        want.sort_by_key(|&(_, t, id)| (t, id));
        if newest {
            want.reverse();
        }
        want.truncate(10);
        assert_eq!(keyed_rows(&env.sql(&sql).await), want, "{sql}");
        let text = explain_analyze(&env, &sql).await;
        let read = metric(&text, "hot_buckets") + metric(&text, "archived_buckets");
        assert!(
            read * 4 <= total,
            "{sql} ({partitions} partitions) read {read} of {total} buckets:\n{text}"
        );
    }
    env.cleanup().await;
}
