//! The shared secret between coordinators and workers, on both ends of the gRPC channel.
//!
//! Every request a coordinator sends carries the secret in one header, added below the
//! gRPC client so that no call can go without it; a worker's interceptor refuses any
//! request whose header does not match before the request reaches datafusion-distributed.
//! The comparison is of SHA-256 digests, so its time does not depend on where a guess
//! first differs. The secret itself never appears in `Debug`, errors or logs.
//!
//! Over plain HTTP/2 (`http://` worker URLs) the secret keeps strangers from running plans
//! on a worker, but it hides neither the rows nor itself in transit: deploy such workers on
//! a private network or behind a mesh that encrypts. With mutual TLS ([`super::tls`],
//! `https://` URLs) the channel is encrypted and both ends present certificates; the secret
//! may still be set on top (docs/distributed.md, Security).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion_distributed::grpc::{create_worker_client, BoxCloneSyncChannel};
use datafusion_distributed::{
    ChannelResolver, CoordinatorToWorkerMsg, ExecuteTaskRequest, GetWorkerInfoRequest,
    GetWorkerInfoResponse, SetPlanRequest, WorkerChannel, WorkerToCoordinatorMsg,
};
use futures::stream::{BoxStream, StreamExt};
use http::{HeaderMap, HeaderValue};
use sha2::{Digest, Sha256};
use tonic::transport::Endpoint;
use url::Url;

use super::metrics::WorkerMetrics;
use super::tls::{check_scheme, WorkerTls};
use super::DistributedError;

/// The header a coordinator's requests carry the secret in.
pub const SECRET_HEADER: &str = "x-pulpitum-worker-secret";

/// The environment variable both ends read the secret from (never a flag: a command line
/// is visible to every user of the machine).
pub const SECRET_ENV: &str = "PULPITUM_WORKER_SECRET";

/// The shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;

/// The fewest different characters a secret may have: a placeholder (`aaaa...`,
/// `abababab...`) is refused, while a random one of [`MIN_SECRET_LEN`] hex digits has fewer
/// less than once in two million.
pub const MIN_SECRET_DISTINCT: usize = 5;

/// The shared secret.
#[derive(Clone)]
pub struct WorkerSecret {
    value: HeaderValue,
    digest: [u8; 32],
}

impl fmt::Debug for WorkerSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WorkerSecret(<redacted>)")
    }
}

impl WorkerSecret {
    /// A secret of at least [`MIN_SECRET_LEN`] visible ASCII characters (it travels in a
    /// header); the error never repeats it.
    pub fn new(secret: &str) -> Result<Self, DistributedError> {
        if secret.len() < MIN_SECRET_LEN {
            return Err(DistributedError::Secret(format!(
                "{SECRET_ENV} must be at least {MIN_SECRET_LEN} characters long"
            )));
        }
        let mut seen = [false; 256];
        let distinct = secret
            .bytes()
            .filter(|&b| !std::mem::replace(&mut seen[b as usize], true))
            .count();
        if distinct < MIN_SECRET_DISTINCT {
            return Err(DistributedError::Secret(format!(
                "{SECRET_ENV} has fewer than {MIN_SECRET_DISTINCT} different characters, \
                 which no random secret has; generate one with `openssl rand -hex 32`"
            )));
        }
        if !secret.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(DistributedError::Secret(format!(
                "{SECRET_ENV} may hold only visible ASCII characters (no spaces or control characters)"
            )));
        }
        let mut value = HeaderValue::from_str(secret).map_err(|_| {
            DistributedError::Secret(format!("{SECRET_ENV} cannot travel in a header"))
        })?;
        value.set_sensitive(true);
        Ok(Self {
            value,
            digest: Sha256::digest(secret.as_bytes()).into(),
        })
    }

    /// The secret in [`SECRET_ENV`], if set (and non-empty).
    pub fn from_env() -> Result<Option<Self>, DistributedError> {
        match std::env::var(SECRET_ENV) {
            Ok(s) if !s.is_empty() => Self::new(&s).map(Some),
            Ok(_) => Ok(None),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(DistributedError::Secret(format!(
                "{SECRET_ENV} is not valid UTF-8"
            ))),
        }
    }

    /// Whether `presented` is this secret.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let d: [u8; 32] = Sha256::digest(presented).into();
        // Every byte is compared, whatever the first difference.
        d.iter()
            .zip(self.digest.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

/// The worker's gate: a request without the secret is refused `UNAUTHENTICATED`, and
/// counted.
#[derive(Clone)]
pub(crate) struct SecretCheck {
    pub(crate) secret: Arc<WorkerSecret>,
    pub(crate) metrics: Arc<WorkerMetrics>,
}

impl tonic::service::Interceptor for SecretCheck {
    fn call(&mut self, req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let refusal = match req.metadata().get(SECRET_HEADER) {
            Some(v) if self.secret.matches(v.as_bytes()) => return Ok(req),
            Some(_) => "this worker refused the coordinator: wrong PULPITUM_WORKER_SECRET",
            None => "this worker refused the coordinator: no PULPITUM_WORKER_SECRET was presented",
        };
        self.metrics.requests_refused.inc();
        Err(tonic::Status::unauthenticated(refusal))
    }
}

/// How long a connection to a worker may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How often an open connection to a worker is pinged, and how long a ping may go
/// unanswered before the connection (and every query streaming over it) fails: a worker
/// frozen in place (SIGSTOP, a hung host, a black-holed network) otherwise holds a query
/// forever.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// See [`KEEPALIVE_INTERVAL`].
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The channels of a coordinator (and of a worker reading the stages below its own): one
/// lazily connected HTTP/2 channel per worker, pinged while open, with the secret on every
/// request and the worker's URL on every error.
#[derive(Clone)]
pub(crate) struct Channels {
    cache: Arc<Mutex<HashMap<Url, BoxCloneSyncChannel>>>,
    secret: Option<WorkerSecret>,
    tls: Option<WorkerTls>,
}

impl Channels {
    pub(crate) fn new(secret: Option<WorkerSecret>, tls: Option<WorkerTls>) -> Self {
        Self {
            cache: Arc::default(),
            secret,
            tls,
        }
    }

    fn channel(&self, url: &Url) -> DFResult<BoxCloneSyncChannel> {
        let mut cache = self.cache.lock().expect("channel cache poisoned");
        if let Some(c) = cache.get(url) {
            return Ok(c.clone());
        }
        // Checked here too, not only when the list is read: a directory may list anything.
        check_scheme(url, self.tls.is_some())?;
        let mut endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| DataFusionError::Configuration(format!("worker {url}: {e}")))?;
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.client())
                .map_err(|e| DataFusionError::Configuration(format!("worker {url}: {e}")))?;
        }
        let endpoint = endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        // Connected at the first request; a failed connection is tried again by the next.
        let channel = endpoint.connect_lazy();
        let channel = match &self.secret {
            None => BoxCloneSyncChannel::new(channel),
            Some(secret) => {
                let value = secret.value.clone();
                BoxCloneSyncChannel::new(
                    tower::ServiceBuilder::new()
                        .map_request(move |mut req: http::Request<tonic::body::Body>| {
                            req.headers_mut().insert(SECRET_HEADER, value.clone());
                            req
                        })
                        .service(channel),
                )
            }
        };
        cache.insert(url.clone(), channel.clone());
        Ok(channel)
    }
}

/// `e`, saying which worker it came from.
fn from_worker(url: &Url, e: DataFusionError) -> DataFusionError {
    DataFusionError::Context(format!("worker {url}"), Box::new(e))
}

#[async_trait]
impl ChannelResolver for Channels {
    async fn get_worker_client_for_url(&self, url: &Url) -> DFResult<Box<dyn WorkerChannel>> {
        let channel = self.channel(url).map_err(|e| from_worker(url, e))?;
        Ok(Box::new(Named {
            url: url.clone(),
            inner: create_worker_client(channel),
        }))
    }
}

/// A worker's client whose every error names the worker.
struct Named {
    url: Url,
    inner: Box<dyn WorkerChannel>,
}

impl Named {
    fn stream<T: Send + 'static>(
        &self,
        s: BoxStream<'static, DFResult<T>>,
    ) -> BoxStream<'static, DFResult<T>> {
        let url = self.url.clone();
        s.map(move |item| item.map_err(|e| from_worker(&url, e)))
            .boxed()
    }
}

#[async_trait]
impl WorkerChannel for Named {
    async fn coordinator_channel(
        &mut self,
        headers: HeaderMap,
        set_plan_request: SetPlanRequest,
        c2w_stream: BoxStream<'static, CoordinatorToWorkerMsg>,
        metrics: ExecutionPlanMetricsSet,
        task_ctx: &Arc<TaskContext>,
    ) -> DFResult<BoxStream<'static, DFResult<WorkerToCoordinatorMsg>>> {
        let s = self
            .inner
            .coordinator_channel(headers, set_plan_request, c2w_stream, metrics, task_ctx)
            .await
            .map_err(|e| from_worker(&self.url, e))?;
        Ok(self.stream(s))
    }

    async fn execute_task(
        &mut self,
        headers: HeaderMap,
        request: ExecuteTaskRequest,
        metrics: ExecutionPlanMetricsSet,
        task_ctx: &Arc<TaskContext>,
    ) -> DFResult<Vec<BoxStream<'static, DFResult<RecordBatch>>>> {
        let streams = self
            .inner
            .execute_task(headers, request, metrics, task_ctx)
            .await
            .map_err(|e| from_worker(&self.url, e))?;
        Ok(streams.into_iter().map(|s| self.stream(s)).collect())
    }

    async fn get_worker_info(
        &mut self,
        request: GetWorkerInfoRequest,
    ) -> DFResult<GetWorkerInfoResponse> {
        self.inner
            .get_worker_info(request)
            .await
            .map_err(|e| from_worker(&self.url, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_compared_whole_and_never_printed() {
        let s = WorkerSecret::new("correct horse battery").unwrap_err();
        assert!(s.to_string().contains("visible ASCII"), "{s}");
        let s = WorkerSecret::new("correct-horse-battery-staple").unwrap();
        assert!(s.matches(b"correct-horse-battery-staple"));
        assert!(!s.matches(b"correct-horse-battery-stapl"));
        assert!(!s.matches(b"correct-horse-battery-staple2"));
        assert!(!format!("{s:?}").contains("horse"));
        let short = WorkerSecret::new("tooshort").unwrap_err().to_string();
        assert!(!short.contains("tooshort"), "{short}");
        for placeholder in [
            "xxxxxxxxxxxxxxxxxxxxxxxx",
            "abababababababababab",
            "abcdabcdabcdabcdabcd",
        ] {
            let e = WorkerSecret::new(placeholder).unwrap_err().to_string();
            assert!(e.contains("different characters"), "{e}");
            assert!(!e.contains(placeholder), "{e}");
        }
        assert!(WorkerSecret::new("abcdeabcdeabcdeabcde").is_ok());
    }
}
