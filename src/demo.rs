//! `pulpitum demo`: a chat table with daily buckets, a realistic synthetic history, and the
//! real archiver moving everything older than 90 days to the archive, so a newcomer sees
//! hot and archived buckets answering one SQL table within minutes.
//!
//! The history is generated from a fixed seed, so two runs at the same scale on the same
//! day load the same messages. Loading goes through fenced batch appends and archiving
//! through [`crate::archiver::Runner`], exactly as in production.

use std::sync::Arc;
use std::time::Duration;

use chrono::{Datelike, Duration as ChronoDuration, NaiveDate, TimeZone, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

use crate::archive::{ArchiveStore, PayloadFormat};
use crate::archiver::{ArchiverConfig, ArchiverError, Runner};
use crate::model::{
    encode_i64, BucketStrategy, EventTime, ModelError, PartitionKey, Record, SortKey, TableId,
};
use crate::provider::surface::Surface;
use crate::store::{HotStore, StoreError, TableDefinition};

/// The demo table's name.
pub const TABLE: &str = "chat";

/// Buckets that ended at least this many days ago are archived.
pub const ARCHIVE_AFTER_DAYS: i64 = 90;

/// How much history to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DemoScale {
    /// Channels (ids 1..=channels).
    pub channels: u32,
    /// Days of history, ending today.
    pub days: u32,
    /// Average messages per channel and day.
    pub messages_per_day: u32,
}

impl DemoScale {
    /// About ten channels over two years, about a million messages.
    pub const FULL: Self = Self {
        channels: 10,
        days: 730,
        messages_per_day: 137,
    };
    /// A few thousand messages over five months: for CI and quick looks.
    pub const SMALL: Self = Self {
        channels: 3,
        days: 150,
        messages_per_day: 12,
    };
}

/// Every way the demo can fail.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The hot store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The archiver failed.
    #[error(transparent)]
    Archiver(#[from] ArchiverError),
    /// A generated value was invalid (a bug in the generator).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Archiving stopped making progress; the first failure.
    #[error("archiving the demo history failed: {0}")]
    Archiving(String),
    /// The demo table exists with another definition.
    #[error("table {TABLE} exists but is not a daily chat table; use another data folder")]
    Conflict,
}

/// What [`load_and_archive`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoReport {
    /// Messages written by this run (0 when the table was already loaded).
    pub loaded: u64,
    /// Buckets published to the archive by this run.
    pub archived_buckets: u64,
    /// Rows moved to the archive by this run.
    pub archived_rows: u64,
    /// Month windows whose archived day buckets this run rewrote into segments.
    pub compacted_windows: u64,
    /// Segments written by this run.
    pub segments: u64,
    /// The archive cutoff: buckets ending at or before it are archived.
    pub cutoff: EventTime,
    /// First day of the generated history.
    pub first_day: NaiveDate,
}

/// Progress callbacks: `(phase, done, total)`; phases are `load` and `archive`.
pub type Progress<'a> = &'a (dyn Fn(&'static str, u64, u64) + Sync);

const WORDS: &[&str] = &[
    "deploy",
    "rollback",
    "coffee",
    "standup",
    "latency",
    "pager",
    "ticket",
    "merge",
    "review",
    "lunch",
    "incident",
    "dashboard",
    "query",
    "index",
    "bucket",
    "archive",
    "release",
    "build",
    "flaky",
    "test",
    "migration",
    "schema",
    "shipping",
    "friday",
    "weekend",
    "retro",
    "design",
    "budget",
    "customer",
    "feature",
    "bug",
    "cache",
    "cluster",
    "node",
    "replica",
    "lease",
];

fn message(rng: &mut StdRng, user: u32) -> String {
    let n = rng.random_range(3..12);
    let words: Vec<&str> = (0..n)
        .map(|_| WORDS[rng.random_range(0..WORDS.len())])
        .collect();
    format!("user{user}: {}", words.join(" "))
}

/// Loads the history (unless the table already has buckets), archives every bucket that
/// ended more than [`ARCHIVE_AFTER_DAYS`] days ago through the real runner, and compacts
/// every month whose buckets are all archived into segments. The store must already be at
/// this build's schema version (migrated), or this fails with
/// [`StoreError::SchemaBehind`].
pub async fn load_and_archive(
    store: Arc<dyn HotStore>,
    archive: Arc<ArchiveStore>,
    scale: DemoScale,
    progress: Progress<'_>,
) -> Result<DemoReport, DemoError> {
    load_and_archive_with(store, archive, scale, true, progress).await
}

/// [`load_and_archive`], compacting or not (the segments benchmark measures both layouts
/// of the same history).
pub async fn load_and_archive_with(
    store: Arc<dyn HotStore>,
    archive: Arc<ArchiveStore>,
    scale: DemoScale,
    compact: bool,
    progress: Progress<'_>,
) -> Result<DemoReport, DemoError> {
    // The schema is the caller's (the binary migrates the embedded default it creates and
    // only checks any other store): say so now rather than at the first insert.
    store.check_schema().await?;
    let table = TableId::new(TABLE)?;
    let def = TableDefinition::new(
        table.clone(),
        BucketStrategy::CalendarDayUtc,
        Surface::Chat.as_str(),
    );
    let stored = store.register_table(&def).await.map_err(|e| match e {
        StoreError::TableConflict { .. } => DemoError::Conflict,
        e => e.into(),
    })?;
    if stored.strategy != BucketStrategy::CalendarDayUtc || stored.surface != Surface::Chat.as_str()
    {
        return Err(DemoError::Conflict);
    }
    let today = Utc::now().date_naive();
    let first_day = today - ChronoDuration::days(i64::from(scale.days) - 1);
    let cutoff_day = today - ChronoDuration::days(ARCHIVE_AFTER_DAYS);
    let cutoff = EventTime::from_datetime(
        Utc.from_utc_datetime(&cutoff_day.and_hms_opt(0, 0, 0).expect("midnight")),
    )?;
    let mut report = DemoReport {
        loaded: 0,
        archived_buckets: 0,
        archived_rows: 0,
        compacted_windows: 0,
        segments: 0,
        cutoff,
        first_day,
    };

    let already_loaded = !store
        .list_buckets(&table, &crate::store::BucketFilter::default())
        .await?
        .is_empty();
    if !already_loaded {
        report.loaded = load(&*store, &table, scale, first_day, today, progress).await?;
    }

    let mut config = ArchiverConfig::with_defaults();
    config.eligible_before = Some(cutoff);
    // Nobody reads yet, so the hot rows may go as soon as the route is published.
    config.cleanup_delay = Duration::ZERO;
    config.format = PayloadFormat::Parquet;
    config.scan_limit = 100_000;
    config.concurrency = 8;
    let runner = Runner::new(store.clone(), archive, config)?;
    let never = CancellationToken::new();
    loop {
        let cycle = runner
            .run_cycle(&never, &|done, total| {
                progress("archive", done as u64, total as u64)
            })
            .await?;
        report.archived_buckets += cycle.archived as u64;
        if cycle.discovered == 0 || cycle.archived + cycle.cleaned == 0 {
            if let Some(e) = cycle.errors.first() {
                return Err(DemoError::Archiving(e.clone()));
            }
            break;
        }
    }
    report.archived_rows = runner.metrics().rows_archived.get();
    // Every month fully archived becomes one segment: a few objects instead of one per
    // channel and day.
    if !compact {
        return Ok(report);
    }
    let compacted = runner.compact_pass().await?;
    if let Some(e) = compacted.errors.first() {
        return Err(DemoError::Archiving(e.clone()));
    }
    report.compacted_windows = compacted.windows as u64;
    report.segments = compacted.segments as u64;
    Ok(report)
}

async fn load(
    store: &dyn HotStore,
    table: &TableId,
    scale: DemoScale,
    first_day: NaiveDate,
    today: NaiveDate,
    progress: Progress<'_>,
) -> Result<u64, DemoError> {
    let mut rng = StdRng::seed_from_u64(0x9017_7175);
    let total_days = (today - first_day).num_days() + 1;
    let total = total_days as u64 * u64::from(scale.channels);
    let mut done = 0u64;
    let mut loaded = 0u64;
    let now = Utc::now();
    for channel in 1..=i64::from(scale.channels) {
        // Busier and quieter channels, with quieter weekends.
        let rate =
            f64::from(scale.messages_per_day) * (0.5 + channel as f64 / f64::from(scale.channels));
        let mut next_id: i64 = channel * 1_000_000_000;
        let mut day = first_day;
        while day <= today {
            let weekend = day.weekday().number_from_monday() >= 6;
            let mean = if weekend { rate * 0.4 } else { rate * 1.15 };
            let n = rng.random_range((mean * 0.6) as u32..=(mean * 1.4).max(1.0) as u32);
            let start = Utc.from_utc_datetime(&day.and_hms_opt(0, 0, 0).expect("midnight"));
            let mut offsets: Vec<i64> = (0..n)
                .map(|_| rng.random_range(0..86_400_000_000i64))
                .collect();
            offsets.sort_unstable();
            let mut batch = Vec::with_capacity(offsets.len());
            for off in offsets {
                let at = start + ChronoDuration::microseconds(off);
                if at > now {
                    continue; // no messages from the future
                }
                next_id += 1;
                batch.push(Record {
                    partition_key: PartitionKey::from_i64(channel),
                    event_time: EventTime::from_datetime(at)?,
                    sort_key: SortKey::new(encode_i64(next_id).to_vec())?,
                    value: {
                        let user = rng.random_range(1..40);
                        message(&mut rng, user).into_bytes()
                    },
                });
            }
            if !batch.is_empty() {
                let out = store.append_batch(table, &batch).await?;
                loaded += out.inserted;
            }
            done += 1;
            progress("load", done, total);
            day = day.succ_opt().expect("valid date");
        }
    }
    Ok(loaded)
}

/// Example statements for the REPL, with literal bounds computed from the report.
pub fn example_queries(report: &DemoReport) -> Vec<(&'static str, String)> {
    let old_day = report.first_day + ChronoDuration::days(10);
    let next = old_day + ChronoDuration::days(1);
    let recent = Utc::now().date_naive() - ChronoDuration::days(ARCHIVE_AFTER_DAYS + 30);
    vec![
        (
            "messages per channel, hot and archived alike",
            format!("SELECT channel_id, count(*) AS messages, min(timestamp) AS first, max(timestamp) AS last FROM {TABLE} GROUP BY channel_id ORDER BY channel_id;"),
        ),
        (
            "the five newest messages of channel 3 (reads only the newest bucket)",
            format!("SELECT timestamp, id, content FROM {TABLE} WHERE channel_id = 3 ORDER BY timestamp DESC, id DESC LIMIT 5;"),
        ),
        (
            "one old day, served from the archive",
            format!("SELECT count(*) FROM {TABLE} WHERE channel_id = 3 AND timestamp >= '{old_day}T00:00:00Z' AND timestamp < '{next}T00:00:00Z';"),
        ),
        (
            "hot and archived buckets side by side in one plan",
            format!("EXPLAIN SELECT count(*) FROM {TABLE} WHERE channel_id = 3 AND timestamp >= '{recent}T00:00:00Z';"),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn small_demo_archives_old_buckets_and_keeps_recent_ones_hot() {
        let store: Arc<dyn HotStore> =
            Arc::new(crate::store::embedded::SqliteStore::open_in_memory().unwrap());
        let archive = Arc::new(ArchiveStore::from_url("memory://").unwrap());
        // The demo checks the schema and never migrates: that is its caller's step.
        assert!(matches!(
            load_and_archive(
                store.clone(),
                archive.clone(),
                DemoScale::SMALL,
                &|_, _, _| {}
            )
            .await,
            Err(DemoError::Store(StoreError::SchemaBehind { .. }))
        ));
        store.migrate().await.unwrap();
        let scale = DemoScale {
            channels: 2,
            days: 100,
            messages_per_day: 4,
        };
        let report = load_and_archive(store.clone(), archive.clone(), scale, &|_, _, _| {})
            .await
            .unwrap();
        assert!(report.loaded > 0);
        let buckets = store
            .list_buckets(
                &TableId::new(TABLE).unwrap(),
                &crate::store::BucketFilter::default(),
            )
            .await
            .unwrap();
        let (mut archived, mut hot) = (0, 0);
        for b in &buckets {
            let old = b.id.bucket_key.end() <= report.cutoff;
            match &b.state {
                crate::store::BucketState::Archived {
                    hot_deleted: true, ..
                } => {
                    assert!(old, "{} archived although recent", b.id);
                    archived += 1;
                }
                crate::store::BucketState::Hot => {
                    assert!(!old, "{} still hot although old", b.id);
                    hot += 1;
                }
                other => panic!("{} left {other:?}", b.id),
            }
        }
        assert_eq!(archived as u64, report.archived_buckets);
        assert!(archived > 0 && hot > 0);
        // A second run loads nothing and archives nothing new.
        let again = load_and_archive(store, archive, scale, &|_, _, _| {})
            .await
            .unwrap();
        assert_eq!((again.loaded, again.archived_buckets), (0, 0));
    }
}
