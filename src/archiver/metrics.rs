//! Archiver counters and gauges, their Prometheus exposition, and the health answer.
//!
//! `prometheus-client` owns the text format (escaping, `_total` suffixes, `# EOF`) so this
//! module only declares metrics; [`serve`] answers `/healthz` with the health verdict and
//! every other path with the metrics text, over [`crate::exposition`]. Health is judged from progress, not from liveness of the loop: a
//! process whose every bucket fails is running but not healthy. The only label is a table
//! id (the per-table lag and backlog), so nothing from a URL or a credential can leak into
//! the exposition.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tracing::warn;

use crate::exposition::{self, Answer, OPENMETRICS};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;

use crate::store::{Eligibility, HotStore};

use super::CycleReport;

/// How long the backlog count may take before the cycle gives up on it (the gauges keep
/// their previous values; the count is information, not work).
const BACKLOG_DEADLINE: Duration = Duration::from_secs(10);

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The one label any metric carries: a table id, which the registry validates as a plain
/// identifier, so nothing from a URL or a credential can reach the exposition.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableLabel {
    /// The table id.
    pub table: String,
}

/// A counter that also remembers when it last moved, in unix seconds (0: never).
#[derive(Debug, Default, Clone)]
pub struct StampedCounter {
    count: Counter,
    at: Gauge,
}

impl StampedCounter {
    /// Adds one and stamps the time.
    pub fn inc(&self) -> u64 {
        self.inc_by(1)
    }

    /// Adds `v` and stamps the time.
    pub fn inc_by(&self, v: u64) -> u64 {
        self.at.set(unix_now());
        self.count.inc_by(v)
    }

    /// The count.
    pub fn get(&self) -> u64 {
        self.count.get()
    }

    /// Unix seconds of the last increment (0: never).
    pub fn last_at(&self) -> i64 {
        self.at.get()
    }
}

/// Keeps [`ArchiverMetrics::buckets_in_flight`] raised while alive.
#[derive(Debug)]
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        // Cancellation safety: a dropped bucket future stops counting as in flight.
        self.0.dec();
    }
}

/// The counters and gauges one archiver process keeps.
#[derive(Debug, Clone)]
pub struct ArchiverMetrics {
    /// Buckets published to the archive.
    pub buckets_archived: StampedCounter,
    /// Buckets whose hot rows were deleted after publication.
    pub buckets_cleaned: StampedCounter,
    /// Buckets returned to Hot with a retry time.
    pub buckets_deferred: Counter,
    /// Bucket attempts that ended in an error.
    pub buckets_failed: Counter,
    /// Rows written to archives.
    pub rows_archived: Counter,
    /// Payload bytes written to archives.
    pub bytes_archived: Counter,
    /// Hot rows deleted by cleanup.
    pub rows_deleted: Counter,
    /// Claims lost while working (expired or taken over).
    pub lease_losses: Counter,
    /// Job history rows that could not be written (the work went on without them).
    pub history_write_failures: Counter,
    /// Per table: seconds since the end of its oldest eligible bucket not yet archived.
    pub table_lag: Family<TableLabel, Gauge>,
    /// Per table: eligible buckets not yet archived.
    pub table_backlog: Family<TableLabel, Gauge>,
    /// Orphaned objects deleted by GC.
    pub gc_deletions: Counter,
    /// Segments written by compaction.
    pub segments_written: Counter,
    /// Buckets whose routes compaction moved to segments.
    pub buckets_compacted: Counter,
    /// Delete and edit records whose rows a rewrite applied (marked rewritten).
    pub masks_purged: Counter,
    /// Rewritten delete and edit records garbage collection forgot.
    pub masks_forgotten: Counter,
    /// Segment payload bytes written.
    pub bytes_compacted: Counter,
    /// Window compactions that ended in an error.
    pub compactions_failed: Counter,
    /// Objects replaced by segments and deleted by GC after the retirement delay.
    pub retired_deletions: Counter,
    /// Discovery cycles finished (whatever their items' outcomes).
    pub cycles: Counter,
    /// Hot buckets ended by the cutoff, not yet archived, at the end of the last cycle
    /// (every process's backlog: it is counted in the store).
    pub backlog_buckets: Gauge,
    /// Buckets claimed and not yet published by any process, at the end of the last cycle.
    pub archiving_buckets: Gauge,
    /// Work items this process is working on now.
    pub buckets_in_flight: Gauge,
    /// Unix seconds of the last cycle in which no item failed (0: none yet).
    pub last_success: Gauge,
    /// Unix seconds at which this process started.
    pub started: Gauge,
    /// One line on the last finished cycle, for the health answer.
    last_cycle: Arc<Mutex<String>>,
}

impl Default for ArchiverMetrics {
    fn default() -> Self {
        let started = Gauge::default();
        started.set(unix_now());
        Self {
            buckets_archived: StampedCounter::default(),
            buckets_cleaned: StampedCounter::default(),
            buckets_deferred: Counter::default(),
            buckets_failed: Counter::default(),
            rows_archived: Counter::default(),
            bytes_archived: Counter::default(),
            rows_deleted: Counter::default(),
            lease_losses: Counter::default(),
            history_write_failures: Counter::default(),
            table_lag: Family::default(),
            table_backlog: Family::default(),
            gc_deletions: Counter::default(),
            segments_written: Counter::default(),
            buckets_compacted: Counter::default(),
            masks_purged: Counter::default(),
            masks_forgotten: Counter::default(),
            bytes_compacted: Counter::default(),
            compactions_failed: Counter::default(),
            retired_deletions: Counter::default(),
            cycles: Counter::default(),
            backlog_buckets: Gauge::default(),
            archiving_buckets: Gauge::default(),
            buckets_in_flight: Gauge::default(),
            last_success: Gauge::default(),
            started,
            last_cycle: Arc::new(Mutex::new("no cycle has finished yet".into())),
        }
    }
}

/// The health verdict: `Ok` with a one-line summary, or `Err` with a one-line reason.
pub type Health = Result<String, String>;

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl ArchiverMetrics {
    /// Counts the work item as in flight until the returned guard is dropped.
    pub fn track_in_flight(&self) -> InFlight {
        self.buckets_in_flight.inc();
        InFlight(self.buckets_in_flight.clone())
    }

    /// Records a finished cycle: refreshes the backlog gauges with one count in the store
    /// (`cutoff` as discovery used it) and stamps success when no item failed.
    pub async fn cycle_finished(&self, store: &dyn HotStore, rule: &Eligibility, r: &CycleReport) {
        let line = format!(
            "last cycle: {} of {} work items failed",
            r.failed, r.discovered
        );
        if r.failed == 0 {
            self.last_success.set(unix_now());
        }
        *self.last_cycle.lock().expect("not poisoned") = line;
        match tokio::time::timeout(BACKLOG_DEADLINE, store.backlog(rule)).await {
            Ok(Ok(b)) => {
                self.backlog_buckets.set(count(b.eligible));
                self.archiving_buckets.set(count(b.archiving));
                // Tables caught up since the last count drop out rather than keep a stale lag.
                self.table_lag.clear();
                self.table_backlog.clear();
                let now = unix_now();
                for t in &b.tables {
                    let label = TableLabel {
                        table: t.table_id.to_string(),
                    };
                    let lag = t.oldest_eligible_end.map_or(0, |end| {
                        now.saturating_sub(end.as_micros().div_euclid(1_000_000))
                            .max(0)
                    });
                    self.table_lag.get_or_create(&label).set(lag);
                    self.table_backlog
                        .get_or_create(&label)
                        .set(count(t.eligible));
                }
            }
            Ok(Err(e)) => warn!(error = %e, "counting the backlog failed"),
            Err(_) => warn!("counting the backlog exceeded its deadline"),
        }
        // Counted last: a scrape that sees the cycle sees its backlog too (counted first, a
        // scrape in between read the cycle with the gauges of before it).
        self.cycles.inc();
    }

    /// Unix seconds of the last sign of progress: a cycle without failures, a published
    /// bucket or a cleaned one; the start time before any.
    pub fn last_progress(&self) -> i64 {
        [
            self.last_success.get(),
            self.buckets_archived.last_at(),
            self.buckets_cleaned.last_at(),
            self.started.get(),
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
    }

    /// Healthy when the last progress is at most `max_age` old at `now` (unix seconds).
    pub fn health_at(&self, now: i64, max_age: Duration) -> Health {
        let age = now.saturating_sub(self.last_progress()).max(0);
        let limit = i64::try_from(max_age.as_secs()).unwrap_or(i64::MAX);
        let last = self.last_cycle.lock().expect("not poisoned").clone();
        if age <= limit {
            Ok(format!("ok: last progress {age} s ago; {last}"))
        } else {
            Err(format!(
                "unhealthy: no successful cycle, published or cleaned bucket for {age} s (limit {limit} s); {last}"
            ))
        }
    }

    /// [`health_at`](Self::health_at) now.
    pub fn health(&self, max_age: Duration) -> Health {
        self.health_at(unix_now(), max_age)
    }

    /// Renders every metric in the Prometheus/OpenMetrics text format.
    pub fn render(&self) -> String {
        let mut r = Registry::with_prefix("pulpitum_archiver");
        let counters: [(&str, &str, &Counter); 17] = [
            (
                "buckets_archived",
                "Buckets published to the archive",
                &self.buckets_archived.count,
            ),
            (
                "buckets_cleaned",
                "Buckets whose hot rows were deleted",
                &self.buckets_cleaned.count,
            ),
            (
                "buckets_deferred",
                "Buckets returned to Hot for a later retry",
                &self.buckets_deferred,
            ),
            (
                "buckets_failed",
                "Bucket attempts that ended in an error",
                &self.buckets_failed,
            ),
            (
                "rows_archived",
                "Rows written to archives",
                &self.rows_archived,
            ),
            (
                "bytes_archived",
                "Payload bytes written to archives",
                &self.bytes_archived,
            ),
            (
                "rows_deleted",
                "Hot rows deleted after publication",
                &self.rows_deleted,
            ),
            (
                "lease_losses",
                "Claims lost while working",
                &self.lease_losses,
            ),
            (
                "gc_deletions",
                "Orphaned archive objects deleted",
                &self.gc_deletions,
            ),
            ("cycles", "Discovery cycles finished", &self.cycles),
            (
                "segments_written",
                "Segments written by compaction",
                &self.segments_written,
            ),
            (
                "buckets_compacted",
                "Buckets whose routes compaction moved to segments",
                &self.buckets_compacted,
            ),
            (
                "masks_purged",
                "Delete and edit records whose rows a rewrite applied",
                &self.masks_purged,
            ),
            (
                "masks_forgotten",
                "Rewritten delete and edit records forgotten by GC",
                &self.masks_forgotten,
            ),
            (
                "bytes_compacted",
                "Segment payload bytes written by compaction",
                &self.bytes_compacted,
            ),
            (
                "compactions_failed",
                "Window compactions that ended in an error",
                &self.compactions_failed,
            ),
            (
                "retired_deletions",
                "Objects replaced by segments and deleted after the retirement delay",
                &self.retired_deletions,
            ),
        ];
        for (name, help, m) in counters {
            r.register(name, help, m.clone());
        }
        let gauges: [(&str, &str, &Gauge); 7] = [
            (
                "backlog_buckets",
                "Hot buckets ended by the cutoff and not yet archived, counted at the end of the last cycle",
                &self.backlog_buckets,
            ),
            (
                "archiving_buckets",
                "Buckets claimed and not yet published by any archiver, counted at the end of the last cycle",
                &self.archiving_buckets,
            ),
            (
                "buckets_in_flight",
                "Work items this process is working on",
                &self.buckets_in_flight,
            ),
            (
                "last_success_timestamp_seconds",
                "Unix time of the last cycle in which no work item failed (0: none yet)",
                &self.last_success,
            ),
            (
                "last_publish_timestamp_seconds",
                "Unix time of the last bucket this process published (0: none yet)",
                &self.buckets_archived.at,
            ),
            (
                "last_cleanup_timestamp_seconds",
                "Unix time of the last bucket this process cleaned up (0: none yet)",
                &self.buckets_cleaned.at,
            ),
            (
                "start_timestamp_seconds",
                "Unix time at which this process started",
                &self.started,
            ),
        ];
        for (name, help, m) in gauges {
            r.register(name, help, m.clone());
        }
        r.register(
            "history_write_failures",
            "Job history rows that could not be written (the work went on without them)",
            self.history_write_failures.clone(),
        );
        r.register(
            "table_lag_seconds",
            "Per table: seconds since the end of its oldest eligible bucket not yet archived, at the end of the last cycle",
            self.table_lag.clone(),
        );
        r.register(
            "table_backlog_buckets",
            "Per table: eligible buckets not yet archived, at the end of the last cycle",
            self.table_backlog.clone(),
        );
        let mut out = String::new();
        encode(&mut out, &r).expect("writing to a String cannot fail");
        out
    }
}

/// The HTTP answer to one request path: `/healthz` gets the health verdict as plain text
/// (200 or 503), anything else the metrics.
fn respond(path: &str, metrics: &ArchiverMetrics, max_age: Duration) -> Answer {
    if path == "/healthz" {
        return match metrics.health(max_age) {
            Ok(line) => (200, "text/plain; charset=utf-8", line + "\n"),
            Err(line) => (503, "text/plain; charset=utf-8", line + "\n"),
        };
    }
    (200, OPENMETRICS, metrics.render())
}

/// Serves the metrics and `/healthz` on `addr` until the task is dropped; health allows
/// `max_age` without progress. Returns the bound address (useful with port 0).
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<ArchiverMetrics>,
    max_age: Duration,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    exposition::serve(addr, move |path| respond(path, &metrics, max_age)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_counters_gauges_and_health() {
        let m = Arc::new(ArchiverMetrics::default());
        m.buckets_archived.inc_by(3);
        m.gc_deletions.inc();
        m.backlog_buckets.set(7);
        let (addr, task) = serve(
            "127.0.0.1:0".parse().unwrap(),
            m.clone(),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
        let out = get(addr, "/metrics").await;
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        for line in [
            "pulpitum_archiver_buckets_archived_total 3",
            "pulpitum_archiver_gc_deletions_total 1",
            "pulpitum_archiver_backlog_buckets 7",
            "pulpitum_archiver_buckets_in_flight 0",
            "pulpitum_archiver_last_success_timestamp_seconds 0",
        ] {
            assert!(out.contains(line), "{line} missing: {out}");
        }
        let published = m.buckets_archived.last_at();
        assert!(
            out.contains(&format!(
                "pulpitum_archiver_last_publish_timestamp_seconds {published}"
            )),
            "{out}"
        );
        let health = get(addr, "/healthz").await;
        assert!(health.starts_with("HTTP/1.1 200 OK"), "{health}");
        assert!(health.contains("ok: last progress"), "{health}");
        task.abort();
    }

    #[test]
    fn health_turns_on_progress_age() {
        let m = ArchiverMetrics::default();
        let start = m.started.get();
        let limit = Duration::from_secs(60);
        assert!(m.health_at(start + 60, limit).is_ok());
        let err = m.health_at(start + 61, limit).unwrap_err();
        assert!(err.contains("for 61 s (limit 60 s)"), "{err}");
        assert!(!err.contains('\n'), "one line: {err}");
        // A published bucket counts as progress.
        m.buckets_archived.inc();
        let published = m.buckets_archived.last_at();
        assert!(m.health_at(published + 60, limit).is_ok());
        // So does a cycle without failures.
        m.last_success.set(published + 100);
        assert!(m.health_at(published + 150, limit).is_ok());
        assert!(m.health_at(published + 161, limit).is_err());
    }

    #[test]
    fn in_flight_guard_counts_until_dropped() {
        let m = ArchiverMetrics::default();
        let a = m.track_in_flight();
        let b = m.track_in_flight();
        assert_eq!(m.buckets_in_flight.get(), 2);
        drop(a);
        assert_eq!(m.buckets_in_flight.get(), 1);
        drop(b);
        assert_eq!(m.buckets_in_flight.get(), 0);
    }
}
