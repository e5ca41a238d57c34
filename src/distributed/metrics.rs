//! A worker's own counters, exposed for Prometheus by `pulpitum worker --metrics-addr`.
//!
//! EXPLAIN ANALYZE shows what one query did on each worker; these show what a worker has
//! done over its life, for dashboards and alerts: connections held and refused over the
//! limit, requests by gRPC method, requests refused for a wrong or missing secret, and the
//! Pulpitum scan tasks it ran with the rows they produced. The only label is a method
//! name from a fixed list, so nothing a caller sends (a path, a header, a secret) can reach
//! the exposition or grow it.

use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::exposition::{Answer, OPENMETRICS};

/// The label of the request counter: one of datafusion-distributed's worker methods, or
/// `other`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabel {
    /// The method.
    pub method: &'static str,
}

/// The method a gRPC request path names, from a fixed list.
fn method_of(path: &str) -> &'static str {
    match path.rsplit('/').next().unwrap_or("") {
        "CoordinatorChannel" => "coordinator_channel",
        "ExecuteTask" => "execute_task",
        "GetWorkerInfo" => "get_worker_info",
        _ => "other",
    }
}

/// Everything one worker counts.
#[derive(Debug, Default)]
pub struct WorkerMetrics {
    /// Connections open now.
    pub connections: Gauge,
    /// Connections closed on arrival because the worker held its maximum.
    pub connections_refused: Counter,
    /// gRPC requests received, by method (counted before the secret check).
    pub requests: Family<MethodLabel, Counter>,
    /// Requests refused for a missing or wrong secret.
    pub requests_refused: Counter,
    /// Pulpitum scan task partitions started.
    pub scan_tasks: Counter,
    /// Those running now.
    pub scan_tasks_active: Gauge,
    /// Rows they produced.
    pub scan_rows: Counter,
    /// Those that ended in an error.
    pub scan_errors: Counter,
}

impl WorkerMetrics {
    /// Counts one request for `path`.
    pub fn request(&self, path: &str) {
        self.requests
            .get_or_create(&MethodLabel {
                method: method_of(path),
            })
            .inc();
    }

    /// The OpenMetrics text.
    pub fn render(&self) -> String {
        let mut r = Registry::with_prefix("pulpitum_worker");
        r.register(
            "connections",
            "Connections open now",
            self.connections.clone(),
        );
        r.register(
            "connections_refused",
            "Connections closed on arrival because the worker held --max-connections",
            self.connections_refused.clone(),
        );
        r.register(
            "requests",
            "gRPC requests received, by method",
            self.requests.clone(),
        );
        r.register(
            "requests_refused",
            "Requests refused for a missing or wrong PULPITUM_WORKER_SECRET",
            self.requests_refused.clone(),
        );
        r.register(
            "scan_tasks",
            "Pulpitum scan task partitions started",
            self.scan_tasks.clone(),
        );
        r.register(
            "scan_tasks_active",
            "Pulpitum scan task partitions running now",
            self.scan_tasks_active.clone(),
        );
        r.register(
            "scan_rows",
            "Rows produced by Pulpitum scan tasks",
            self.scan_rows.clone(),
        );
        r.register(
            "scan_errors",
            "Pulpitum scan task partitions that ended in an error",
            self.scan_errors.clone(),
        );
        let mut out = String::new();
        encode(&mut out, &r).expect("writing to a String cannot fail");
        out
    }

    /// The HTTP answer for `path`: `/healthz` says the worker is serving, anything else
    /// gets the metrics.
    pub fn answer(self: &Arc<Self>, path: &str) -> Answer {
        if path == "/healthz" {
            return (200, "text/plain; charset=utf-8", "serving\n".into());
        }
        (200, OPENMETRICS, self.render())
    }
}

/// Keeps a gauge raised while it lives.
#[derive(Debug)]
pub(crate) struct Raised(Gauge);

impl Raised {
    pub(crate) fn new(g: &Gauge) -> Self {
        g.inc();
        Self(g.clone())
    }
}

impl Drop for Raised {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_come_from_a_fixed_list_and_render_with_their_names() {
        let m = Arc::new(WorkerMetrics::default());
        m.request("/worker.WorkerService/ExecuteTask");
        m.request("/worker.WorkerService/ExecuteTask");
        m.request("/x/hunter2-secret");
        m.scan_rows.inc_by(42);
        {
            let _open = Raised::new(&m.connections);
            assert!(m.render().contains("pulpitum_worker_connections 1"));
        }
        let text = m.render();
        for line in [
            "pulpitum_worker_requests_total{method=\"execute_task\"} 2",
            "pulpitum_worker_requests_total{method=\"other\"} 1",
            "pulpitum_worker_scan_rows_total 42",
            "pulpitum_worker_connections 0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert!(!text.contains("hunter2"), "{text}");
        assert_eq!(m.answer("/healthz").0, 200);
        assert!(m.answer("/metrics").2.contains("# EOF"));
    }
}
