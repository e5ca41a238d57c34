//! The smallest HTTP/1.1 answerer that a Prometheus scrape and a health probe need, shared
//! by the archiver's and the worker's metrics listeners.
//!
//! One request per connection, its first line read within two seconds, answered and closed:
//! that is all a scraper or a probe does, and it spares a web framework. The responder sees
//! only the path (without its query), so nothing else a client sends can reach an answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A status code, a content type and a body.
pub type Answer = (u16, &'static str, String);

/// The content type of the OpenMetrics text `prometheus-client` encodes.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The path of an HTTP request's first line, without its query (`/` when there is none).
pub fn request_path(request: &str) -> &str {
    let path = request
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("/");
    path.split('?').next().unwrap_or(path)
}

/// Serves `respond(path)` on `addr` until the task is dropped. Returns the bound address
/// (useful with port 0) and the task.
pub async fn serve(
    addr: SocketAddr,
    respond: impl Fn(&str) -> Answer + Send + Sync + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let respond = Arc::new(respond);
    let handle = tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                // Out of descriptors, say: wait rather than spin on the error.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let respond = respond.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                let n = tokio::time::timeout(Duration::from_secs(2), sock.read(&mut buf))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]);
                let (status, content_type, body) = respond(request_path(&request));
                let reason = match status {
                    200 => "OK",
                    404 => "Not Found",
                    _ => "Service Unavailable",
                };
                let head = format!(
                    "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
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

    #[test]
    fn the_path_is_the_first_lines_second_word_without_its_query() {
        assert_eq!(
            request_path("GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n"),
            "/metrics"
        );
        assert_eq!(request_path("GET /healthz HTTP/1.1"), "/healthz");
        assert_eq!(request_path(""), "/");
        assert_eq!(request_path("garbage"), "/");
    }
}
