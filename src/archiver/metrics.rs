//! Archiver counters and their Prometheus exposition.
//!
//! `prometheus-client` owns the text format (escaping, `_total` suffixes, `# EOF`) so this
//! module only declares counters; [`serve`] answers every HTTP request on the metrics
//! address with the current text, which is all a scraper needs and spares a web framework.

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The counters one archiver process keeps.
#[derive(Debug, Default, Clone)]
pub struct ArchiverMetrics {
    /// Buckets published to the archive.
    pub buckets_archived: Counter,
    /// Buckets whose hot rows were deleted after publication.
    pub buckets_cleaned: Counter,
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
    /// Orphaned objects deleted by GC.
    pub gc_deletions: Counter,
}

impl ArchiverMetrics {
    /// Renders all counters in the Prometheus/OpenMetrics text format.
    pub fn render(&self) -> String {
        let mut registry = Registry::with_prefix("pulpitum_archiver");
        let c = |r: &mut Registry, name: &str, help: &str, m: &Counter| {
            r.register(name, help, m.clone());
        };
        c(
            &mut registry,
            "buckets_archived",
            "Buckets published to the archive",
            &self.buckets_archived,
        );
        c(
            &mut registry,
            "buckets_cleaned",
            "Buckets whose hot rows were deleted",
            &self.buckets_cleaned,
        );
        c(
            &mut registry,
            "buckets_deferred",
            "Buckets returned to Hot for a later retry",
            &self.buckets_deferred,
        );
        c(
            &mut registry,
            "buckets_failed",
            "Bucket attempts that ended in an error",
            &self.buckets_failed,
        );
        c(
            &mut registry,
            "rows_archived",
            "Rows written to archives",
            &self.rows_archived,
        );
        c(
            &mut registry,
            "bytes_archived",
            "Payload bytes written to archives",
            &self.bytes_archived,
        );
        c(
            &mut registry,
            "rows_deleted",
            "Hot rows deleted after publication",
            &self.rows_deleted,
        );
        c(
            &mut registry,
            "lease_losses",
            "Claims lost while working",
            &self.lease_losses,
        );
        c(
            &mut registry,
            "gc_deletions",
            "Orphaned archive objects deleted",
            &self.gc_deletions,
        );
        let mut out = String::new();
        encode(&mut out, &registry).expect("writing to a String cannot fail");
        out
    }
}

/// Serves the metrics text on `addr` until the task is dropped. Returns the bound address
/// (useful with port 0).
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<ArchiverMetrics>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let handle = tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                continue;
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                // Read (and ignore) the request head; every path answers with the metrics.
                let mut buf = [0u8; 2048];
                let _ =
                    tokio::time::timeout(std::time::Duration::from_secs(2), sock.read(&mut buf))
                        .await;
                let body = metrics.render();
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = sock.write_all(head.as_bytes()).await;
                let _ = sock.write_all(body.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    Ok((bound, handle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn serves_counters_as_text() {
        let m = Arc::new(ArchiverMetrics::default());
        m.buckets_archived.inc_by(3);
        m.gc_deletions.inc();
        let (addr, task) = serve("127.0.0.1:0".parse().unwrap(), m.clone())
            .await
            .unwrap();
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        assert!(
            out.contains("pulpitum_archiver_buckets_archived_total 3"),
            "{out}"
        );
        assert!(
            out.contains("pulpitum_archiver_gc_deletions_total 1"),
            "{out}"
        );
        task.abort();
    }
}
