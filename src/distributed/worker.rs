//! `pulpitum worker`: a stateless process that runs plan fragments for coordinators.
//!
//! It listens for datafusion-distributed's gRPC service behind the shared-secret check
//! ([`super::auth`]) and decodes each received scan against its own hot store and archive,
//! opened with the same settings as the shell's. It keeps nothing between queries but
//! connections; any number can run, and one can be killed at any time (the queries it was
//! serving fail, naming it).
//!
//! It refuses to start without a way to authenticate its callers (the secret, mutual TLS or
//! both), unless it listens on a loopback address and was told `--insecure-no-auth`: a
//! worker runs any plan it is sent, with the hot store's credentials.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use datafusion::error::DataFusionError;
use datafusion_distributed::{DistributedExt, Worker, WorkerQueryContext};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::service::InterceptorLayer;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::transport::Server;
use tower::util::MapRequestLayer;
use tracing::warn;

use super::auth::{
    Channels, SecretCheck, WorkerSecret, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT, SECRET_ENV,
};
use super::codec::{ScanCodec, Tiers};
use super::metrics::{Raised, WorkerMetrics};
use super::tls::WorkerTls;
use super::DistributedError;

/// How a worker is started.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// The address to listen on.
    pub listen: SocketAddr,
    /// The shared secret.
    pub secret: Option<WorkerSecret>,
    /// Mutual TLS: serve TLS, and accept only callers with a certificate from the CA.
    pub tls: Option<WorkerTls>,
    /// Accept coordinators without a secret (only on a loopback address).
    pub insecure_no_auth: bool,
    /// Connections held at once; one more is closed on arrival (and counted).
    pub max_connections: usize,
}

/// Connections a worker holds at once unless told otherwise. A coordinator keeps one
/// HTTP/2 connection to each worker and multiplexes its queries over it, and so does each
/// worker to the others, so a deployment needs about as many as it has processes.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

impl WorkerOptions {
    /// Refuses a start that would let anyone run plans.
    pub fn check(&self) -> Result<(), DistributedError> {
        let authenticated = self.secret.is_some() || self.tls.is_some();
        match (authenticated, self.insecure_no_auth) {
            (true, true) => Err(DistributedError::Worker(format!(
                "--insecure-no-auth contradicts {SECRET_ENV} and --worker-tls-*; drop one"
            ))),
            (true, false) => Ok(()),
            (false, true) if self.listen.ip().is_loopback() => Ok(()),
            (false, true) => Err(DistributedError::Worker(format!(
                "--insecure-no-auth is refused on {}: without a secret or mutual TLS a worker \
                 listens only on a loopback address",
                self.listen.ip()
            ))),
            (false, false) => Err(DistributedError::Worker(format!(
                "set {SECRET_ENV} (the same on coordinators and workers) or mutual TLS \
                 (--worker-tls-ca/-cert/-key), or for a local test listen on 127.0.0.1 with \
                 --insecure-no-auth"
            ))),
        }
    }
}

/// datafusion-distributed's worker, decoding scans against `tiers`: what `pulpitum worker`
/// serves. A stage reads the stages below it from other workers, so a worker's own requests
/// carry `secret` (and present `tls`) too. The split scans it runs count on `metrics`.
pub(crate) fn plan_worker(
    tiers: Tiers,
    secret: Option<WorkerSecret>,
    tls: Option<WorkerTls>,
    metrics: Arc<WorkerMetrics>,
) -> Worker {
    let codec = ScanCodec::metered(tiers, metrics);
    let channels = Channels::new(secret, tls);
    Worker::from_session_builder(move |ctx: WorkerQueryContext| {
        let (codec, channels) = (codec.clone(), channels.clone());
        async move {
            Ok::<_, DataFusionError>(
                ctx.builder
                    .with_distributed_user_codec(codec)
                    .with_distributed_channel_resolver(channels)
                    .build(),
            )
        }
    })
}

/// The gRPC server, pinging its coordinators: the connection of a coordinator that vanished
/// without closing it is closed. (Scan tasks it started may still read on for a while:
/// docs/production-readiness.md, distributed gaps.)
fn server() -> Server {
    Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .tcp_nodelay(true)
}

/// Binds `opts.listen`; the returned listener's address is the worker's (port 0 picks one).
pub async fn bind(opts: &WorkerOptions) -> Result<TcpListener, DistributedError> {
    opts.check()?;
    TcpListener::bind(opts.listen)
        .await
        .map_err(|e| DistributedError::Worker(format!("cannot listen on {}: {e}", opts.listen)))
}

/// A connection the worker accepted, holding one of its `--max-connections` slots and the
/// open-connections gauge until it is closed.
struct Held {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
    _open: Raised,
}

impl AsyncRead for Held {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Held {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl Connected for Held {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

/// The connections `listener` accepts, at most `max` at once: one past that is closed at
/// once and counted, so a flood of connections cannot exhaust the worker's descriptors or
/// memory. An accept error (out of descriptors) is waited out, not retried in a tight loop.
fn held_connections(
    listener: TcpListener,
    max: usize,
    metrics: Arc<WorkerMetrics>,
) -> impl futures::Stream<Item = std::io::Result<Held>> {
    let max = max.max(1);
    let slots = Arc::new(Semaphore::new(max));
    futures::stream::unfold(
        (listener, slots, metrics),
        move |(listener, slots, metrics)| async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        warn!(error = %e, "worker: accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    let refused = metrics.connections_refused.inc() + 1;
                    drop(stream);
                    // Said once per hundred refusals, so a flood cannot flood the log too.
                    if refused % 100 == 1 {
                        warn!(
                            max,
                            refused,
                            "worker: holding --max-connections connections, closing new ones \
                             (a stranger holding unfinished handshakes or idle connections, or \
                             more coordinators and workers than the limit allows)"
                        );
                    }
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let held = Held {
                    stream,
                    _slot: slot,
                    _open: Raised::new(&metrics.connections),
                };
                return Some((Ok(held), (listener, slots, metrics)));
            }
        },
    )
}

/// Serves plan fragments on `listener` until `shutdown` completes, counting on `metrics`.
pub async fn serve_worker(
    listener: TcpListener,
    opts: &WorkerOptions,
    tiers: Tiers,
    metrics: Arc<WorkerMetrics>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), DistributedError> {
    opts.check()?;
    let service = plan_worker(
        tiers,
        opts.secret.clone(),
        opts.tls.clone(),
        metrics.clone(),
    )
    .into_worker_server();
    let incoming = held_connections(listener, opts.max_connections, metrics.clone());
    let mut server = server();
    if let Some(tls) = &opts.tls {
        server = server
            .tls_config(tls.server())
            .map_err(|e| DistributedError::Tls(e.to_string()))?;
    }
    let counted = metrics.clone();
    let mut server = server.layer(MapRequestLayer::new(
        move |req: http::Request<tonic::body::Body>| {
            counted.request(req.uri().path());
            req
        },
    ));
    let result = match &opts.secret {
        Some(secret) => {
            server
                .layer(InterceptorLayer::new(SecretCheck {
                    secret: Arc::new(secret.clone()),
                    metrics,
                }))
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await
        }
        None => {
            server
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await
        }
    };
    result.map_err(|e| DistributedError::Worker(format!("serving: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(listen: &str, secret: bool, insecure: bool) -> WorkerOptions {
        WorkerOptions {
            listen: listen.parse().unwrap(),
            secret: secret.then(|| WorkerSecret::new("0123456789abcdef0123").unwrap()),
            tls: None,
            insecure_no_auth: insecure,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }

    #[test]
    fn a_worker_without_a_secret_starts_only_on_loopback_when_told_so() {
        assert!(opts("0.0.0.0:7600", true, false).check().is_ok());
        assert!(opts("127.0.0.1:7600", false, true).check().is_ok());
        assert!(opts("[::1]:7600", false, true).check().is_ok());
        let e = opts("0.0.0.0:7600", false, true).check().unwrap_err();
        assert!(e.to_string().contains("loopback"), "{e}");
        let e = opts("127.0.0.1:7600", false, false).check().unwrap_err();
        assert!(e.to_string().contains(SECRET_ENV), "{e}");
        assert!(opts("127.0.0.1:7600", true, true).check().is_err());
    }
}
