//! `pulpitum worker`: a stateless process that runs plan fragments for coordinators.
//!
//! It listens for datafusion-distributed's gRPC service behind the shared-secret check
//! ([`super::auth`]) and decodes each received scan against its own hot store and archive,
//! opened with the same settings as the shell's. It keeps nothing between queries but
//! connections; any number can run, and one can be killed at any time (the queries it was
//! serving fail, naming it).
//!
//! It refuses to start without a secret, unless it listens on a loopback address and was
//! told `--insecure-no-auth`: a worker runs any plan it is sent, with the hot store's
//! credentials.

use std::net::SocketAddr;
use std::sync::Arc;

use datafusion::error::DataFusionError;
use datafusion_distributed::{DistributedExt, Worker, WorkerQueryContext};
use tokio::net::TcpListener;
use tonic::service::InterceptorLayer;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

use super::auth::{
    Channels, SecretCheck, WorkerSecret, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT, SECRET_ENV,
};
use super::codec::{ScanCodec, Tiers};
use super::DistributedError;

/// How a worker is started.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// The address to listen on.
    pub listen: SocketAddr,
    /// The shared secret.
    pub secret: Option<WorkerSecret>,
    /// Accept coordinators without a secret (only on a loopback address).
    pub insecure_no_auth: bool,
}

impl WorkerOptions {
    /// Refuses a start that would let anyone run plans.
    pub fn check(&self) -> Result<(), DistributedError> {
        match (&self.secret, self.insecure_no_auth) {
            (Some(_), true) => Err(DistributedError::Worker(format!(
                "--insecure-no-auth and {SECRET_ENV} contradict each other; drop one"
            ))),
            (Some(_), false) => Ok(()),
            (None, true) if self.listen.ip().is_loopback() => Ok(()),
            (None, true) => Err(DistributedError::Worker(format!(
                "--insecure-no-auth is refused on {}: without a secret a worker listens only \
                 on a loopback address",
                self.listen.ip()
            ))),
            (None, false) => Err(DistributedError::Worker(format!(
                "set {SECRET_ENV} (the same on coordinators and workers), or for a local \
                 test listen on 127.0.0.1 with --insecure-no-auth"
            ))),
        }
    }
}

/// datafusion-distributed's worker, decoding scans against `tiers`: what `pulpitum worker`
/// serves, and what a coordinator runs its own single-task stages on. A stage reads the
/// stages below it from other workers, so a worker's own requests carry `secret` too.
pub(crate) fn plan_worker(tiers: Tiers, secret: Option<WorkerSecret>) -> Worker {
    let codec = ScanCodec::new(tiers);
    let channels = Channels::new(secret);
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

/// The gRPC server, pinging its coordinators: a coordinator that vanished without closing
/// its connections stops holding the tasks it started.
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

/// Serves plan fragments on `listener` until `shutdown` completes.
pub async fn serve_worker(
    listener: TcpListener,
    opts: &WorkerOptions,
    tiers: Tiers,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), DistributedError> {
    opts.check()?;
    let service = plan_worker(tiers, opts.secret.clone()).into_worker_server();
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let result = match &opts.secret {
        Some(secret) => {
            server()
                .layer(InterceptorLayer::new(SecretCheck(Arc::new(secret.clone()))))
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await
        }
        None => {
            server()
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
            insecure_no_auth: insecure,
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
