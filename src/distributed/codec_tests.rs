//! The codec's round trip: a scan encoded for a worker decodes to the same scan, and a
//! malformed plan is refused naming what is wrong.

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::physical_plan::{collect, displayable};
use datafusion::prelude::SessionContext;

use super::*;
use crate::store::embedded::SqliteStore;

async fn memory() -> (Tiers, SessionContext) {
    let store: Arc<dyn HotStore> = Arc::new(SqliteStore::open_in_memory().unwrap());
    store.migrate().await.unwrap();
    let archive = Arc::new(ArchiveStore::from_url("memory://").unwrap());
    let ctx = crate::session::session(store.clone(), archive.clone(), Default::default())
        .await
        .unwrap();
    let tiers = Tiers {
        store,
        archive,
        route_cache: RouteCacheConfig::default(),
    };
    (tiers, ctx)
}

fn scan_of(plan: &Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    let mut found = None;
    plan.apply(|p| {
        if p.downcast_ref::<PulpitumScanExec>().is_some() {
            found = Some(p.clone());
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .unwrap();
    found.expect("a Pulpitum scan in the plan")
}

fn line(p: &Arc<dyn ExecutionPlan>) -> String {
    displayable(p.as_ref()).one_line().to_string()
}

/// A declared table's scan, with bounds, partitions, value predicates and routes of
/// both tiers, decodes to the scan that was encoded and reads the same rows; a split
/// keeps each task's buckets; malformed plans are refused, naming what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_crosses_to_a_worker_unchanged() {
    let (tiers, ctx) = memory().await;
    for sql in [
        "CREATE EXTERNAL TABLE events (tenant_id BIGINT NOT NULL, at TIMESTAMPTZ NOT NULL, \
         seq BIGINT NOT NULL, kind TEXT NOT NULL, amount DOUBLE PRECISION) STORED AS \
         PULPITUM LOCATION '' OPTIONS ('partition_by' 'tenant_id', 'time' 'at', \
         'order_by' 'seq', 'bucket_strategy' 'calendar_day_utc')",
        "INSERT INTO events VALUES (1, TIMESTAMP '2024-01-02T10:00:00Z', 1, 'a', 1.5), \
         (1, TIMESTAMP '2024-01-03T10:00:00Z', 2, 'a', 3.5), \
         (2, TIMESTAMP '2024-01-02T11:00:00Z', 1, 'b', 4.5), \
         (2, TIMESTAMP '2024-01-04T11:00:00Z', 2, 'a', 5.5), \
         (3, TIMESTAMP '2024-01-02T12:00:00Z', 1, 'a', 9.5)",
    ] {
        // Through the statement entry every front end uses (declared tables are
        // created there).
        crate::control::sql(&ctx, sql)
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
    }
    let sql = "SELECT tenant_id, seq, amount FROM events WHERE tenant_id IN (1, 2) \
               AND at >= TIMESTAMP '2024-01-01T00:00:00Z' \
               AND at < TIMESTAMP '2024-02-01T00:00:00Z' AND amount > 2.5 AND kind = 'a'";
    let plan = ctx
        .sql(sql)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let scan = scan_of(&plan);
    assert!(
        line(&scan).contains("archive_value_filters"),
        "{}",
        line(&scan)
    );
    let bytes = encode(&scan).unwrap();
    let back = decode(&bytes, &tiers).unwrap();
    assert_eq!(line(&back), line(&scan));
    let rows = |p: Arc<dyn ExecutionPlan>| {
        let task = ctx.task_ctx();
        async move {
            // Partitions are collected concurrently: compare the rows, not their order.
            let text = pretty_format_batches(&collect(p, task).await.unwrap())
                .unwrap()
                .to_string();
            let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
            lines.sort();
            lines
        }
    };
    assert_eq!(rows(back).await, rows(scan.clone()).await);

    // Routes: an archived one keeps its object and its age.
    let mut spec = scan
        .downcast_ref::<PulpitumScanExec>()
        .unwrap()
        .spec()
        .clone();
    let aged = Instant::now().checked_sub(Duration::from_secs(30)).unwrap();
    spec.keys[0].buckets[0].1 = Route::Archived {
        object_key: "v4/events/x/day:2024-01-02/g1/manifest.json".into(),
        read_at: aged,
    };
    spec.unordered = true;
    let split: Arc<dyn ExecutionPlan> = Arc::new(super::super::tasks::split(&spec, 3).unwrap());
    let back = decode(&encode(&split).unwrap(), &tiers).unwrap();
    let back = back
        .downcast_ref::<TaskScanExec>()
        .expect("a split stays split");
    let original = split.downcast_ref::<TaskScanExec>().unwrap();
    assert_eq!(back.tasks().len(), 3);
    for (a, b) in back.tasks().iter().zip(original.tasks()) {
        let ids = |s: &PulpitumScanExec| -> Vec<String> {
            s.groups()
                .iter()
                .flatten()
                .flat_map(|k| k.buckets.iter().map(|(id, _)| format!("{id:?}")))
                .collect()
        };
        assert_eq!(ids(a), ids(b));
    }
    let (_, route) = &back.tasks()[0].spec().keys[0].buckets[0];
    match route {
        Route::Archived {
            object_key,
            read_at,
        } => {
            assert!(object_key.ends_with("/g1/manifest.json"));
            assert!(read_at.elapsed() >= Duration::from_secs(30));
        }
        Route::Hot => panic!("the archived route came back hot"),
    }

    // Malformed plans.
    let json = |b: &[u8]| -> serde_json::Value {
        serde_json::from_slice(&decompress(b).unwrap()).unwrap()
    };
    let plan = |v: &serde_json::Value| compress(&serde_json::to_vec(v).unwrap()).unwrap();
    let mut v = json(&bytes);
    v["format"] = 99.into();
    let e = decode(&plan(&v), &tiers).unwrap_err();
    assert!(e.to_string().contains("format 99"), "{e}");
    let mut v = json(&bytes);
    v["tasks"][0][0][0]["partition"] = "zz".into();
    let e = decode(&plan(&v), &tiers).unwrap_err();
    assert!(e.to_string().contains("partition key"), "{e}");
    let mut v = json(&bytes);
    v["scan"]["projection"][0] = 99.into();
    let e = decode(&plan(&v), &tiers).unwrap_err();
    assert!(e.to_string().contains("projection"), "{e}");
    let e = decode(b"\x00garbage", &tiers).unwrap_err();
    assert!(e.to_string().contains("not a Pulpitum scan plan"), "{e}");
    // Uncompressed JSON (a format-1 coordinator) and a truncated frame.
    let e = decode(&serde_json::to_vec(&json(&bytes)).unwrap(), &tiers).unwrap_err();
    assert!(e.to_string().contains("not a Pulpitum scan plan"), "{e}");
    let e = decode(&bytes[..bytes.len() / 2], &tiers).unwrap_err();
    assert!(e.to_string().contains("not a Pulpitum scan plan"), "{e}");
    // A frame that would decompress past the bound is refused before it is held whole.
    let bomb = zstd::bulk::compress(&vec![b' '; (MAX_PLAN_BYTES + 1) as usize], 1).unwrap();
    assert!(bomb.len() < 1 << 20);
    let e = decode(&bomb, &tiers).unwrap_err();
    assert!(e.to_string().contains("larger than"), "{e}");

    // What a long scan costs per task: 100 partitions x 64 archived buckets, as one task of
    // a split scan receives them, each object key with 16 random hex digits (a segment's
    // key carries such an id; the worst case for compression).
    let mut v = json(&encode(&split).unwrap());
    let key = v["tasks"][0][0][0].clone();
    let mut keys = Vec::new();
    for p in 0..100u64 {
        let mut k = key.clone();
        let partition = format!("{:016x}", 0x8000_0000_0000_0001u64 + p * 7919);
        k["partition"] = partition.clone().into();
        let mut buckets = Vec::new();
        for b in 0..64u64 {
            let day = format!("day:2024-{:02}-{:02}", 1 + b / 28, 1 + b % 28);
            let id: u64 = rand::random();
            buckets.push(serde_json::json!({
                "key": day,
                "archived": {
                    "object_key": format!("v4/events/{partition}/{day}/g{}/{id:016x}/manifest.json", 1 + b % 3),
                    "age_us": rand::random::<u32>(),
                },
            }));
        }
        k["buckets"] = serde_json::Value::Array(buckets);
        keys.push(k);
    }
    v["tasks"] = serde_json::json!([[keys]]);
    let raw = serde_json::to_vec(&v).unwrap();
    let sent = plan(&v);
    eprintln!(
        "6,400 archived buckets: {} bytes of JSON, {} sent ({:.1}x smaller, {:.1} bytes a bucket)",
        raw.len(),
        sent.len(),
        raw.len() as f64 / sent.len() as f64,
        sent.len() as f64 / 6400.0
    );
    assert!(
        sent.len() * 3 < raw.len(),
        "{} of {}",
        sent.len(),
        raw.len()
    );
    // And it decodes: every bucket key, partition key and route is valid.
    let back = decode(&sent, &tiers).unwrap();
    let back = back.downcast_ref::<TaskScanExec>().unwrap();
    let listed: usize = back.tasks()[0]
        .spec()
        .keys
        .iter()
        .map(|k| k.buckets.len())
        .sum();
    assert_eq!(listed, 6400);
}
