//! The smallest HTTP/1.1 answerer that a Prometheus scrape and a health probe need, shared
//! by the archiver's and the worker's metrics listeners.
//!
//! One request per connection, its first line read within two seconds, answered and closed,
//! at most 64 at once: that is all a scraper or a probe does, and it spares a web framework. The responder sees
//! only the path (without its query), so nothing else a client sends can reach an answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

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
    // A scrape answers in microseconds; more at once than this is a flood, and each one
    // more would cost the process a descriptor its real work needs.
    let slots = Arc::new(Semaphore::new(MAX_OPEN));
    let handle = tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                // Out of descriptors, say: wait rather than spin on the error.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                drop(sock);
                continue;
            };
            let respond = respond.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let request = read_head(&mut sock).await;
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

/// Connections answered at once.
const MAX_OPEN: usize = 64;

/// The request's first line: read until a line break, [`HEAD_BYTES`], the peer's end or two
/// seconds, whichever comes first (a request split across packets still names its path).
async fn read_head(sock: &mut tokio::net::TcpStream) -> String {
    let mut buf = Vec::with_capacity(256);
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let mut chunk = [0u8; 512];
        while buf.len() < HEAD_BYTES && !buf.contains(&b'\n') {
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    String::from_utf8_lossy(&buf).into_owned()
}

/// The most of a request read.
const HEAD_BYTES: usize = 2048;

#[cfg(test)]
mod tests {
    use super::*;

    /// A request line split across packets still names its path; a flood past the cap is
    /// closed without an answer and leaves the listener answering.
    #[tokio::test]
    async fn a_split_request_is_read_whole_and_a_flood_is_capped() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (addr, _task) = serve("127.0.0.1:0".parse().unwrap(), |path| {
            (200, "text/plain", format!("path={path}"))
        })
        .await
        .unwrap();
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /heal").await.unwrap();
        s.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        s.write_all(b"thz HTTP/1.1\r\n\r\n").await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(out.ends_with("path=/healthz"), "{out}");

        // MAX_OPEN silent connections hold every slot; the next is closed unanswered.
        let mut held = Vec::new();
        for _ in 0..MAX_OPEN {
            held.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut extra = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut out = Vec::new();
        let _ = extra.read_to_end(&mut out).await;
        assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));
        drop(held);
        // The held ones time out or close; the listener answers again.
        let mut answered = false;
        for _ in 0..40 {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /m HTTP/1.1\r\n\r\n").await.unwrap();
            let mut out = String::new();
            let _ = s.read_to_string(&mut out).await;
            if out.ends_with("path=/m") {
                answered = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(answered, "the listener stopped answering after a flood");
    }

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
