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
    let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    v["format"] = 99.into();
    let e = decode(&serde_json::to_vec(&v).unwrap(), &tiers).unwrap_err();
    assert!(e.to_string().contains("format 99"), "{e}");
    let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    v["tasks"][0][0][0]["partition"] = "zz".into();
    let e = decode(&serde_json::to_vec(&v).unwrap(), &tiers).unwrap_err();
    assert!(e.to_string().contains("partition key"), "{e}");
    let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    v["scan"]["projection"][0] = 99.into();
    let e = decode(&serde_json::to_vec(&v).unwrap(), &tiers).unwrap_err();
    assert!(e.to_string().contains("projection"), "{e}");
    let e = decode(b"\x00garbage", &tiers).unwrap_err();
    assert!(e.to_string().contains("not a Pulpitum scan plan"), "{e}");
}
