//! Chaos: several archiver processes against the real PostgreSQL and S3 while writers keep
//! appending, archivers are killed with SIGKILL and restarted, a share of object-store calls
//! fail by injection, and the archivers' database connections are dropped. At the end every
//! eligible bucket must be archived and cleaned, every acknowledged row read back exactly
//! once, no unacknowledged row present, and GC must leave no orphan. GC runs in every
//! archiver (at each start, so often, beside the others' publications) at the smallest legal
//! delay for the deadlines used here (`GC_DELAY`), never at zero. Every archiver also
//! compacts the windows it finds archived and cleaned (January and February 2021 here), so
//! segment writes and route switches run beside the archival, under the same kills and
//! faults; at the end every eligible bucket must route to a segment. A changer deletes and
//! edits seeded rows meanwhile (on every tier), against a model: at the end no deleted row
//! is in any routed object and every edit is in the bytes (the rewrites applied them).

mod archiver_support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use archiver_support::*;
use pulpitum::model::{
    BucketId, BucketStrategy, EventTime, PartitionKey, Record, SortKey, TableId,
};
use pulpitum::store::{AppendOutcome, BucketFilter, BucketState, StoreError, TableDefinition};
use rand::Rng;

const CHANNELS: u8 = 4;
const DAYS: i64 = 60;
const WORKERS: usize = 3;
const CHAOS_SECONDS: u64 = 75;
/// How long the longer-lived archiver lives between kills.
const COMPACTOR_LIFE: Duration = Duration::from_secs(12);

/// Deadlines of every archiver here, and the smallest GC delay they allow: above the upload
/// deadline (3 s) plus the publication window at a 1 s operation deadline (13 s) plus the
/// 5 s clock-skew allowance.
// The retirement delay is cut to seconds (no backup retention, readers bounded at 1 s) so
// that replaced objects are collected within the test: a reader holding a route longer
// meets NotFound and follows the new route.
const DEADLINES: [&str; 12] = [
    "--op-deadline-seconds",
    "1",
    "--upload-deadline-seconds",
    "3",
    "--gc-delay-seconds",
    "22",
    "--backup-retention-seconds",
    "0",
    "--reader-route-cache-seconds",
    "1",
    "--reader-statement-timeout-seconds",
    "1",
];
const GC_DELAY: Duration = Duration::from_secs(22);

/// Objects that no published route references.
async fn orphans(
    store: &dyn pulpitum::store::HotStore,
    archive: &pulpitum::archive::ArchiveStore,
) -> Vec<pulpitum::archive::ObjectInfo> {
    let refs: Vec<String> = store.referenced_object_keys().await.unwrap();
    let dirs: BTreeSet<&str> = refs.iter().map(|k| k.rsplit_once('/').unwrap().0).collect();
    archive
        .list_objects()
        .await
        .unwrap()
        .into_iter()
        .filter(|o| !dirs.contains(o.key.rsplit_once('/').unwrap().0))
        .collect()
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

type Key = (Vec<u8>, i64, Vec<u8>);

/// Rows a change of unknown outcome left in one of several states (`None`: deleted).
type Uncertain = HashMap<Key, Vec<Option<Vec<u8>>>>;

fn key(r: &Record) -> Key {
    (
        r.partition_key.as_bytes().to_vec(),
        r.event_time.as_micros(),
        r.sort_key.as_bytes().to_vec(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn archivers_survive_kills_faults_and_dropped_connections() {
    let chaos_seconds = env_num("PULPITUM_CHAOS_SECONDS", CHAOS_SECONDS);
    let db = fresh_database("chaos").await;
    let archive_url = fresh_archive_url("chaos");
    let (store, archive) = open(&db, &archive_url).await;
    let table = TableId::new("chat").unwrap();
    let strategy = BucketStrategy::CalendarDayUtc;
    store
        .register_table(&TableDefinition::new(table.clone(), strategy, "chat"))
        .await
        .unwrap();

    // Seed every eligible bucket (2021) so it exists, plus keep writing during the chaos.
    let start = EventTime::parse_rfc3339("2021-01-01T00:00:00Z")
        .unwrap()
        .as_micros();
    let day_us = 86_400_000_000i64;
    let acked: Arc<std::sync::Mutex<HashMap<Key, Vec<u8>>>> = Arc::default();
    let unknown: Arc<std::sync::Mutex<HashMap<Key, Vec<u8>>>> = Arc::default();
    let rejected: Arc<std::sync::Mutex<Vec<Key>>> = Arc::default();
    let seq = Arc::new(AtomicU64::new(0));
    let make = |c: u8, t: i64, n: u64| Record {
        partition_key: PartitionKey::new(vec![c]).unwrap(),
        event_time: EventTime::from_micros(t).unwrap(),
        sort_key: SortKey::new(n.to_be_bytes().to_vec()).unwrap(),
        value: format!("m{n}").into_bytes(),
    };
    let mut seeded: Vec<Record> = Vec::new();
    for c in 1..=CHANNELS {
        let records: Vec<Record> = (0..DAYS)
            .flat_map(|d| (0..5).map(move |i| (d, i)))
            .map(|(d, i)| {
                make(
                    c,
                    start + d * day_us + i * 1_000_000,
                    seq.fetch_add(1, Ordering::Relaxed),
                )
            })
            .collect();
        store.append_batch(&table, &records).await.unwrap();
        let mut a = acked.lock().unwrap();
        for r in &records {
            a.insert(key(r), r.value.clone());
        }
        seeded.extend(records);
    }
    let eligible: BTreeSet<BucketId> = store
        .list_buckets(&table, &BucketFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(eligible.len(), CHANNELS as usize * DAYS as usize);

    // Writers: into eligible (soon fenced) buckets and into a current, never-eligible one.
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (store, table, acked, unknown, rejected, seq, stop) = (
            store.clone(),
            table.clone(),
            acked.clone(),
            unknown.clone(),
            rejected.clone(),
            seq.clone(),
            stop.clone(),
        );
        writers.push(tokio::spawn(async move {
            let now_us = EventTime::from_datetime(chrono::Utc::now().with_nanosecond_zero())
                .unwrap()
                .as_micros();
            while !stop.load(Ordering::Relaxed) {
                let (c, t) = {
                    let mut rng = rand::rng();
                    let c = rng.random_range(1..=CHANNELS);
                    let t = if w % 2 == 0 {
                        start
                            + rng.random_range(0..DAYS) * day_us
                            + rng.random_range(0..day_us / 1_000_000) * 1_000_000
                    } else {
                        now_us - rng.random_range(0..3_600) * 1_000_000
                    };
                    (c, t)
                };
                let r = make(c, t, seq.fetch_add(1, Ordering::Relaxed));
                match store.append(&table, &r).await {
                    Ok(AppendOutcome::Inserted) => {
                        acked.lock().unwrap().insert(key(&r), r.value.clone());
                    }
                    Ok(AppendOutcome::AlreadyPresent) => panic!("fresh key reported present"),
                    Err(StoreError::Fenced { .. }) => rejected.lock().unwrap().push(key(&r)),
                    Err(_) => {
                        unknown.lock().unwrap().insert(key(&r), r.value.clone());
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }

    // A changer: DELETEs and UPDATEs of seeded rows through the store's change API (what a
    // SQL statement hands it), on hot, archiving and archived buckets alike, checked
    // against the model: the first row of a seeded day may be deleted, the second edited
    // (so no bucket is emptied). A refusal (being archived, changed meanwhile) changes
    // nothing; an error of unknown outcome makes the row's state one of two.
    let deleted: Arc<std::sync::Mutex<BTreeSet<Key>>> = Arc::default();
    let uncertain: Arc<std::sync::Mutex<Uncertain>> = Arc::default();
    let changes_done: Arc<[AtomicU64; 3]> = Arc::default();
    let changer = {
        let (store, table, acked, deleted, uncertain, changes_done, stop) = (
            store.clone(),
            table.clone(),
            acked.clone(),
            deleted.clone(),
            uncertain.clone(),
            changes_done.clone(),
            stop.clone(),
        );
        let seeded = seeded.clone();
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let (pick, delete) = {
                    let mut rng = rand::rng();
                    let day = rng.random_range(0..seeded.len() / 5);
                    let delete = rng.random_bool(0.5);
                    (day * 5 + usize::from(!delete), delete)
                };
                let r = &seeded[pick];
                let k = key(r);
                let Some(old) = acked.lock().unwrap().get(&k).cloned() else {
                    continue; // deleted or uncertain already
                };
                n += 1;
                let new = (!delete).then(|| format!("edit {n}").into_bytes());
                let change = pulpitum::store::RowChange {
                    partition_key: r.partition_key.clone(),
                    event_time: r.event_time,
                    sort_key: r.sort_key.clone(),
                    old_value: old.clone(),
                    new_value: new.clone(),
                };
                let read_at = store.now().await.unwrap();
                match store.apply_changes(&table, read_at, &[change]).await {
                    Ok(o) if o.total() == 1 => {
                        changes_done[usize::from(!delete)].fetch_add(1, Ordering::Relaxed);
                        let mut a = acked.lock().unwrap();
                        match new {
                            Some(v) => {
                                a.insert(k, v);
                            }
                            None => {
                                a.remove(&k);
                                deleted.lock().unwrap().insert(k);
                            }
                        }
                    }
                    Ok(o) => panic!("one change applied as {o:?}"),
                    Err(StoreError::BeingArchived { .. } | StoreError::ChangeConflict { .. }) => {
                        changes_done[2].fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        acked.lock().unwrap().remove(&k);
                        uncertain.lock().unwrap().insert(k, vec![Some(old), new]);
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    // Archivers with injected faults, killed and restarted at random.
    let stats_dir = tempfile::tempdir().unwrap();
    let incarnation = AtomicU64::new(0);
    let spawn_worker = || {
        let mut c = archiver(&db, &archive_url);
        let stats_file = stats_dir.path().join(format!(
            "faults-{}",
            incarnation.fetch_add(1, Ordering::Relaxed)
        ));
        c.args([
            "--eligible-before",
            "2022-01-01T00:00:00Z",
            "--interval-seconds",
            "0.3",
            "--lease-seconds",
            "2",
            "--retry-seconds",
            "0.2",
            "--cleanup-delay-seconds",
            "0.2",
            "--scan-limit",
            "16",
        ])
        .args(DEADLINES)
        .env("PULPITUM_FAULT_RATE", "0.15")
        .env("PULPITUM_FAULT_SEED", rand::random::<u32>().to_string())
        .env("PULPITUM_FAULT_STATS_FILE", &stats_file)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
        c.spawn().expect("spawn archiver")
    };
    let mut workers: Vec<_> = (0..WORKERS).map(|_| spawn_worker()).collect();
    // One more archiver, killed less often (every `COMPACTOR_LIFE`), so that a window
    // compaction, which reads every bucket of a month, gets the time to finish beside the
    // short-lived ones, under the same faults.
    let mut compactor = spawn_worker();
    let mut compactor_born = Instant::now();
    let mut compactor_kills = 0u32;
    let (admin, conn) = tokio_postgres::connect(&pg_base_url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut kills = 0u32;
    let mut dropped_connections = 0u64;
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(chaos_seconds) {
        let pause = rand::rng().random_range(800..2_500);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let victim = rand::rng().random_range(0..WORKERS);
        let _ = workers[victim].start_kill(); // SIGKILL
        let _ = workers[victim].wait().await;
        kills += 1;
        if compactor_born.elapsed() >= COMPACTOR_LIFE {
            let _ = compactor.start_kill();
            let _ = compactor.wait().await;
            compactor_kills += 1;
            compactor = spawn_worker();
            compactor_born = Instant::now();
        }
        workers[victim] = spawn_worker();
        if rand::rng().random_bool(0.5) {
            let n = admin
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                    &[&"pulpitum-archiver"],
                )
                .await
                .unwrap();
            dropped_connections += n;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    changer.await.unwrap();
    let _ = compactor.start_kill();
    let _ = compactor.wait().await;
    for w in &mut workers {
        let _ = w.start_kill();
        let _ = w.wait().await;
    }

    // Object-store calls and injected failures, as last reported by every incarnation.
    let (mut store_calls, mut injected) = (0u64, 0u64);
    for entry in std::fs::read_dir(stats_dir.path()).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap_or_default();
        let mut it = text
            .split_whitespace()
            .map(|v| v.parse::<u64>().unwrap_or(0));
        store_calls += it.next().unwrap_or(0);
        injected += it.next().unwrap_or(0);
    }

    let (mut archived_during_chaos, mut compacted_during_chaos) = (0, 0);
    for b in &eligible {
        if let BucketState::Archived { object_key, .. } =
            store.bucket(b).await.unwrap().unwrap().state
        {
            archived_during_chaos += 1;
            if object_key.contains("/segments/") {
                compacted_during_chaos += 1;
            }
        }
    }

    // Settle: fault-free archivers until no work is left.
    let mut settle_rounds = 0;
    loop {
        settle_rounds += 1;
        let out = archiver(&db, &archive_url)
            .args([
                "--once",
                "--eligible-before",
                "2022-01-01T00:00:00Z",
                "--lease-seconds",
                "2",
                "--retry-seconds",
                "0",
                "--cleanup-delay-seconds",
                "0",
                "--scan-limit",
                "1000",
            ])
            .args(DEADLINES)
            .output()
            .await
            .unwrap();
        let all_done = {
            // Every mask rewritten: no work but the due kind is left (a cutoff before
            // everything leaves only masks not yet rewritten).
            let min = EventTime::min_supported();
            let mut done = store
                .next_compaction_start(&table, min, min)
                .await
                .unwrap()
                .is_none();
            for b in &eligible {
                if !matches!(
                    store.bucket(b).await.unwrap().unwrap().state,
                    BucketState::Archived {
                        hot_deleted: true,
                        ..
                    }
                ) {
                    done = false;
                }
            }
            done
        };
        assert!(
            settle_rounds < 20,
            "not settled: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if all_done && out.status.success() {
            // Orphans younger than the GC delay are kept by design: wait until the youngest
            // is old enough, and let the next run's GC pass delete them.
            let left = orphans(&*store, &archive).await;
            let Some(youngest) = left.iter().filter_map(|o| o.last_modified).max() else {
                break;
            };
            let age = (chrono::Utc::now() - youngest).to_std().unwrap_or_default();
            tokio::time::sleep((GC_DELAY + Duration::from_secs(1)).saturating_sub(age)).await;
            continue;
        }
        tokio::time::sleep(Duration::from_millis(2_100)).await; // let dead workers' leases expire
    }

    // Orphans of dead workers, whatever their age: GC with no delay (below what the binary
    // accepts, so through the library) once every worker has stopped.
    // Retired objects too: no reader is left to hold an old route.
    pulpitum::archiver::collect_garbage_with(
        &*store,
        &archive,
        pulpitum::archiver::GcDelays {
            orphans: Duration::ZERO,
            retired: Duration::ZERO,
            erased: Duration::ZERO,
        },
        &pulpitum::archiver::ArchiverMetrics::default(),
    )
    .await
    .unwrap();
    // Compaction ran beside the archivers (every archiver compacts when its archival is
    // caught up) and in the settling runs: every eligible bucket ends in a segment.
    let mut in_segments = 0;
    for b in &eligible {
        if let BucketState::Archived { object_key, .. } =
            store.bucket(b).await.unwrap().unwrap().state
        {
            in_segments += usize::from(object_key.contains("/segments/"));
        }
    }
    assert_eq!(
        in_segments,
        eligible.len(),
        "every eligible bucket compacted"
    );
    assert!(store.retired_objects().await.unwrap().is_empty());

    // Read everything back through the routes.
    let mut seen: BTreeMap<Key, Vec<u8>> = BTreeMap::new();
    let mut duplicates = 0u64;
    let all_buckets = store
        .list_buckets(&table, &BucketFilter::default())
        .await
        .unwrap();
    for meta in &all_buckets {
        for r in read_bucket(&*store, &archive, &meta.id).await {
            if seen.insert(key(&r), r.value.clone()).is_some() {
                duplicates += 1;
            }
        }
    }
    let acked = acked.lock().unwrap().clone();
    let unknown = unknown.lock().unwrap().clone();
    let rejected = rejected.lock().unwrap().clone();
    let lost = acked
        .iter()
        .filter(|(k, v)| seen.get(*k) != Some(*v))
        .count();
    let phantom = seen
        .keys()
        .filter(|k| !acked.contains_key(*k) && !unknown.contains_key(*k))
        .count();
    let resurrected = rejected.iter().filter(|k| seen.contains_key(*k)).count();
    // Read raw from the routed objects (no masks applied): a deleted row still there, or
    // an edit not in the bytes, means the rewrite did not happen.
    let deleted = deleted.lock().unwrap().clone();
    let undeleted = deleted.iter().filter(|k| seen.contains_key(*k)).count();
    let uncertain = uncertain.lock().unwrap().clone();
    let off_model = uncertain
        .iter()
        .filter(|(k, allowed)| !allowed.contains(&seen.get(*k).cloned()))
        .count();
    let phantom = phantom
        - seen
            .keys()
            .filter(|k| {
                !acked.contains_key(*k) && !unknown.contains_key(*k) && uncertain.contains_key(*k)
            })
            .count();
    let objects = archive.list_objects().await.unwrap();
    let orphans = orphans(&*store, &archive).await.len();
    let anomalies =
        lost + phantom + resurrected + undeleted + off_model + duplicates as usize + orphans;
    let [deletes, edits, refused] = [0, 1, 2].map(|i| changes_done[i].load(Ordering::Relaxed));
    eprintln!(
        "chaos: buckets {} (eligible {}), rows acknowledged {}, rejected by fence {}, outcome unknown {}, \
         workers {WORKERS} + 1, kills {kills} + {compactor_kills}, dropped connections {dropped_connections}, \
         object-store calls {store_calls} with {injected} injected failures, \
         published during the chaos {archived_during_chaos}, in segments during the chaos {compacted_during_chaos}, settle rounds {settle_rounds}, objects {}, \
         changes: deletes {deletes}, edits {edits}, refused {refused}, uncertain {}, anomalies {anomalies} \
         (lost {lost}, phantom {phantom}, resurrected {resurrected}, deleted rows still stored {undeleted}, \
         uncertain off the model {off_model}, duplicates {duplicates}, orphans {orphans})",
        all_buckets.len(),
        eligible.len(),
        acked.len(),
        rejected.len(),
        unknown.len(),
        objects.len(),
        uncertain.len(),
    );
    assert!(deletes > 0 && edits > 0, "the changer changed nothing");
    assert!(kills >= 3, "too few kills to mean anything");
    assert!(
        injected * 10 >= store_calls && injected > 0,
        "fewer than 10% of object-store calls failed ({injected} of {store_calls})"
    );
    assert_eq!(anomalies, 0);
}

trait NanoZero {
    fn with_nanosecond_zero(self) -> Self;
}

impl NanoZero for chrono::DateTime<chrono::Utc> {
    fn with_nanosecond_zero(self) -> Self {
        use chrono::Timelike;
        self.with_nanosecond(0).unwrap()
    }
}
