//! Erasure with proof, against PostgreSQL and the embedded store with the real S3: one
//! channel of a table with rows in segments, in per-bucket archives and hot is erased; the
//! proof says pending until compaction has rewritten every object that held the rows and
//! GC has deleted them (early, while objects without erased rows are kept for the backup
//! retention), then gone, each logged object checked absent. Then a hot-store backup from
//! before the erasure is restored: the next archiver start repairs the routes to the
//! deleted objects and deletes the erased rows again, so no erased row comes back and no
//! other row is lost.

mod archiver_support;
mod changes_support;

use std::collections::BTreeSet;
use std::time::Duration;

use archiver_support::{pg_backup, pg_restore, run_tool, schema_of};
use changes_support::*;
use pulpitum::archive::PayloadFormat;
use pulpitum::archiver::{collect_garbage_with, ArchiverConfig, ArchiverMetrics, GcDelays, Runner};
use pulpitum::erasure::{ErasedKey, ErasureId, ObjectState};
use pulpitum::model::EventTime;
use pulpitum::session::{session, SessionOptions};
use pulpitum::table::DurableTable;

/// Readers' bounds of zero (no reader but the test's), the default backup retention.
fn config() -> ArchiverConfig {
    let mut c = ArchiverConfig::with_defaults();
    c.eligible_before = Some(EventTime::parse_rfc3339("2021-06-01T00:00:00Z").unwrap());
    c.cleanup_delay = Duration::ZERO;
    c.compact_after = Duration::ZERO;
    c.reader_route_cache = Duration::ZERO;
    c.reader_statement_timeout = Duration::ZERO;
    c
}

async fn report(env: &Env, id: &ErasureId) -> pulpitum::erasure::ErasureReport {
    let entry = env.archive.read_erasure(id).await.unwrap();
    let def = env.store.table(&env.table).await.unwrap().unwrap();
    let table = DurableTable::new(env.store.clone(), env.archive.clone(), def);
    pulpitum::erasure::report(&table, entry).await.unwrap()
}

async fn stored_dirs(env: &Env) -> BTreeSet<String> {
    env.archive
        .list_objects()
        .await
        .unwrap()
        .into_iter()
        .filter_map(|o| o.key.rsplit_once('/').map(|(d, _)| d.to_string()))
        .collect()
}

async fn erasure(embedded: bool) {
    let label = if embedded { "erase_sq" } else { "erase_pg" };
    let env = Env::new(label, embedded).await;
    let t0 = EventTime::parse_rfc3339(START).unwrap().as_micros();
    let mut model = Model::new();
    let mut recs = Vec::new();
    // Three channels, March and April (archived, then compacted into segments shared by
    // the channels), May (per-bucket archives), June (hot); 3 messages a day.
    for ch in 1..=3i64 {
        for day in [0i64, 1, 31, 32, 62, 63, 93] {
            for k in 0..3 {
                let id = ch * 10_000 + day * 10 + k;
                let t = t0 + day * DAY_US + k;
                recs.push(record(ch, id, t));
                if ch != 1 {
                    model.insert((ch, id), (t, format!("m{id}")));
                }
            }
        }
    }
    env.store.append_batch(&env.table, &recs).await.unwrap();
    env.archive_before("2021-05-01T00:00:00Z", PayloadFormat::Parquet, true)
        .await;
    env.archive_before("2021-06-01T00:00:00Z", PayloadFormat::Json, false)
        .await;

    // The backup an operator took before the request.
    let dump = match &env.dir {
        Some(dir) => {
            let dump = dir.path().join("hot.backup");
            run_tool(
                std::process::Command::new("sqlite3")
                    .arg(dir.path().join("hot.db"))
                    .arg(format!(".backup {}", dump.display())),
            );
            dump
        }
        None => {
            let dump = std::env::temp_dir().join(format!("{}.dump", schema_of(&env.db)));
            pg_backup(&env.db, &dump);
            dump
        }
    };

    let receipt = pulpitum::erasure::request(
        &env.ctx,
        "DELETE FROM chat WHERE channel_id = 1",
        Some("T-1"),
    )
    .await
    .unwrap();
    assert_eq!(receipt.rows, 21, "{receipt:?}");
    assert!(
        receipt.objects >= 4,
        "segments and per-bucket archives held rows: {receipt:?}"
    );
    assert_same(&env.dump().await, &model, "after the request");
    let r = report(&env, &receipt.id).await;
    assert_eq!(r.readable, 0);
    assert_eq!(r.entry.keys.len(), 21);
    assert!(!r.is_gone(), "the objects still hold the rows: {r:?}");
    let logged: Vec<String> = r.entry.objects.clone().unwrap();
    assert_eq!(logged.len(), receipt.objects);

    // The archiver: compaction rewrites every bucket that held the rows (and moves the other
    // channels off the segments), GC deletes the retired objects that held erased rows.
    let runner = Runner::new(env.store.clone(), env.archive.clone(), config()).unwrap();
    assert!(runner.erasure_pass().await, "nothing to re-apply yet");

    // A row written afterwards under an erased row's key, with other content, is not the
    // erased row: the re-apply leaves it (break-it finding: it was deleted at every start).
    let june = t0 + 93 * DAY_US;
    let mut again = record(1, 10_930, june);
    again.value = b"written after the erasure".to_vec();
    env.store.append_batch(&env.table, &[again]).await.unwrap();
    let mut with_new = model.clone();
    with_new.insert((1, 10_930), (june, "written after the erasure".into()));
    // A request that failed (keys logged, no `applied.json`) is not re-applied, and a file
    // beside the log's folders stops nothing (break-it findings).
    let failed = ErasureId::generate(chrono::Utc::now());
    env.archive
        .log_erasure_request(&failed, &env.table, None, chrono::Utc::now())
        .await
        .unwrap();
    let (&(ch, id), &(t, _)) = model.iter().next().unwrap();
    env.archive
        .log_erased_keys(&failed, 1, &[ErasedKey::of(&record(ch, id, t))])
        .await
        .unwrap();
    env.archive
        .operator()
        .write(
            &format!("{}README.txt", env.archive.erasure_log_root()),
            b"notes".to_vec(),
        )
        .await
        .unwrap();
    assert!(runner.erasure_pass().await);
    assert_same(
        &env.dump().await,
        &with_new,
        "after a pass with a later row and a failed request",
    );
    let incomplete = report(&env, &failed).await;
    assert!(!incomplete.is_gone(), "a failed request is never proven");
    for _ in 0..4 {
        let c = runner.compact_pass().await.unwrap();
        assert_eq!(c.failed, 0, "{c:?}");
    }
    // Past the clock-skew allowance the readers' bound (zero here) has passed.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let delays = GcDelays {
        orphans: Duration::ZERO,
        ..runner.gc_delays()
    };
    assert!(delays.erased < delays.retired);
    collect_garbage_with(
        &*env.store,
        &env.archive,
        delays,
        &ArchiverMetrics::default(),
    )
    .await
    .unwrap();
    let r = report(&env, &receipt.id).await;
    assert!(r.is_gone(), "pending: {:?}", r.pending());
    for key in &logged {
        let state = r.objects.iter().find(|(k, _)| k == key).map(|(_, s)| s);
        assert!(
            matches!(
                state,
                Some(ObjectState::Absent {
                    deleted_at: Some(_)
                })
            ),
            "{key}: {state:?}"
        );
    }
    // Objects retired without erased rows are kept for the backup retention.
    let dirs = stored_dirs(&env).await;
    let kept: Vec<_> = env
        .store
        .retired_objects()
        .await
        .unwrap()
        .into_iter()
        .filter(|o| dirs.contains(o.object_key.rsplit_once('/').unwrap().0))
        .collect();
    assert!(
        !kept.is_empty(),
        "retired objects without erased rows are kept"
    );
    assert!(kept.iter().all(|o| !logged.contains(&o.object_key)));
    // The log itself is never garbage.
    assert!(env
        .archive
        .erasure_ids()
        .await
        .unwrap()
        .contains(&receipt.id));
    assert_same(&env.dump().await, &with_new, "after the rewrite and GC");

    // The old backup restored, every process stopped first.
    let Env {
        db,
        archive_url,
        store,
        archive,
        ctx,
        table,
        dir,
    } = env;
    // Every process stopped: nothing cached (routes, segment manifests and row groups)
    // survives into the restarted ones.
    drop((ctx, store, archive, runner));
    tokio::time::sleep(Duration::from_millis(200)).await;
    match &dir {
        Some(d) => run_tool(
            std::process::Command::new("sqlite3")
                .arg(d.path().join("hot.db"))
                .arg(format!(".restore {}", dump.display())),
        ),
        None => pg_restore(&db, &dump).await,
    }
    let _ = std::fs::remove_file(&dump);
    let store = pulpitum::store::open(&db).await.unwrap();
    let archive =
        std::sync::Arc::new(pulpitum::archive::ArchiveStore::from_url(&archive_url).unwrap());
    let ctx = session(store.clone(), archive.clone(), SessionOptions::default())
        .await
        .unwrap();
    // Restored, the erased rows are back in the registry's view and the routes name
    // objects GC deleted: reads fail rather than answer.
    assert!(
        run(&ctx, "SELECT max(content) FROM chat WHERE channel_id = 2")
            .await
            .is_err(),
        "a route to a deleted object fails the read"
    );
    // The archiver's start re-applies the log.
    let runner = Runner::new(store.clone(), archive.clone(), config()).unwrap();
    assert!(runner.erasure_pass().await);
    let env = Env {
        db,
        archive_url,
        ctx: session(store.clone(), archive.clone(), SessionOptions::default())
            .await
            .unwrap(),
        store,
        archive,
        table,
        dir,
    };
    assert_same(&env.dump().await, &model, "restored, after the re-apply");
    let r = report(&env, &receipt.id).await;
    assert_eq!(r.readable, 0, "{r:?}");
    // A second start finds nothing to do.
    assert!(runner.erasure_pass().await);
    assert_same(&env.dump().await, &model, "after a second start");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erasure_is_proven_gone_and_survives_an_older_restore_on_postgres() {
    erasure(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erasure_is_proven_gone_and_survives_an_older_restore_on_the_embedded_store() {
    erasure(true).await;
}
