//! Queries past one machine: plans whose archived scans are large run their scan stages on
//! stateless workers, through datafusion-distributed (docs/distributed.md says why that
//! engine and not Ballista).
//!
//! The coordinator is the process that plans: the shell, an embedding application or
//! `pulpitum serve`, given a worker list ([`DistributedSettings`]). Its session plans as
//! before, then datafusion-distributed cuts the physical plan into stages at its shuffles
//! and merges, asks each Pulpitum scan how many tasks it wants ([`tasks`]) and sends each
//! stage's tasks to the workers over gRPC, the scan serialised by [`codec`]. A worker
//! (`pulpitum worker`, [`worker`]) holds no state between queries: it binds the scans it
//! receives to its own hot store and archive and verifies every object it reads as the
//! coordinator would. Only scans of archived buckets are split; a query whose scans all
//! touch hot buckets runs on the coordinator. Coordinator and workers share a secret
//! ([`auth`]).
//!
//! A worker that fails, vanishes or stops answering mid-query fails the query with an error
//! naming it: the engine retries no task, and the coordinator never falls back to reading
//! locally. A worker list of fewer than two is refused: with one worker every stage would
//! be one task, and the engine would run the query here without ever reaching it.

pub mod auth;
pub mod codec;
mod explain;
pub mod metrics;
pub mod tasks;
pub mod tls;
pub mod worker;

use std::fmt;
use std::sync::Arc;

use datafusion::error::DataFusionError;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion_distributed::{DistributedExt, SessionStateBuilderExt, WorkerResolver};
use url::Url;

pub use auth::WorkerSecret;
pub use codec::{ScanCodec, Tiers};
pub use metrics::WorkerMetrics;
pub use tasks::TaskScanExec;
pub use tls::WorkerTls;
pub use worker::{serve_worker, WorkerOptions};

/// Buckets one task reads, unless the settings say otherwise.
pub const DEFAULT_BUCKETS_PER_TASK: usize = 64;

/// The environment variable the command line reads the worker list from.
pub const WORKERS_ENV: &str = "PULPITUM_WORKERS";

/// Every way distributed planning, a worker's start or a worker itself can fail.
#[derive(Debug, thiserror::Error)]
pub enum DistributedError {
    /// The worker list is malformed.
    #[error("worker list: {0}")]
    WorkerList(String),
    /// The shared secret is missing or unusable.
    #[error("worker secret: {0}")]
    Secret(String),
    /// A scan plan could not be encoded, or a received one is malformed.
    #[error("distributed scan plan: {0}")]
    Plan(String),
    /// The mutual TLS settings are incomplete, or a file is unreadable or does not fit.
    #[error("worker TLS: {0}")]
    Tls(String),
    /// A worker's settings are refused, or its listener failed.
    #[error("worker: {0}")]
    Worker(String),
}

impl From<DistributedError> for DataFusionError {
    fn from(e: DistributedError) -> Self {
        DataFusionError::External(Box::new(e))
    }
}

/// Where the workers are: a fixed list ([`StaticWorkers`]) or anything that can list them
/// now (a Kubernetes endpoint watch, a DNS name), asked before each query is planned and
/// again before its tasks are placed. It must answer at once: resolve in the background.
pub trait WorkerDirectory: Send + Sync + fmt::Debug + 'static {
    /// The workers' URLs; an error or an empty list fails the query (never a silent
    /// fallback to running everything here).
    fn urls(&self) -> Result<Vec<Url>, DistributedError>;
}

/// A fixed worker list, as `--workers` and `PULPITUM_WORKERS` give it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticWorkers(Vec<Url>);

impl StaticWorkers {
    /// Parses `http://host:port,...` (or all `https://`, for mutual TLS): every entry a URL
    /// with a host and a port and nothing else (no user, path or query; a password in a URL
    /// would end up in logs), all of one scheme.
    pub fn parse(list: &str) -> Result<Self, DistributedError> {
        let mut urls: Vec<Url> = Vec::new();
        for (i, entry) in list.split(',').enumerate() {
            let entry = entry.trim();
            let n = i + 1;
            if entry.is_empty() {
                return Err(DistributedError::WorkerList(format!(
                    "entry {n} is empty (separate URLs with single commas)"
                )));
            }
            let url = Url::parse(entry).map_err(|e| {
                DistributedError::WorkerList(format!(
                    "entry {n} is not a URL ({e}); write http://HOST:PORT"
                ))
            })?;
            if url.scheme() != "http" && url.scheme() != "https" {
                return Err(DistributedError::WorkerList(format!(
                    "entry {n} has scheme {:?}; a worker is reached over http:// (or https:// \
                     with mutual TLS)",
                    url.scheme()
                )));
            }
            if urls.first().is_some_and(|u| u.scheme() != url.scheme()) {
                return Err(DistributedError::WorkerList(format!(
                    "entry {n} is {}:// but entry 1 is {}://; every worker is reached the same \
                     way",
                    url.scheme(),
                    urls[0].scheme()
                )));
            }
            if !url.username().is_empty() || url.password().is_some() {
                return Err(DistributedError::WorkerList(format!(
                    "entry {n} holds credentials; the secret goes in {}",
                    auth::SECRET_ENV
                )));
            }
            if url.host_str().is_none_or(str::is_empty) {
                return Err(DistributedError::WorkerList(format!(
                    "entry {n} needs a host (http://HOST:PORT)"
                )));
            }
            if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
                return Err(DistributedError::WorkerList(format!(
                    "entry {n} has a path, query or fragment; a worker URL is http://HOST:PORT"
                )));
            }
            if !urls.contains(&url) {
                urls.push(url);
            }
        }
        if urls.len() < 2 {
            return Err(DistributedError::WorkerList(format!(
                "{} worker listed; at least two are needed (with one, every stage would be \
                 one task and the query would run here, never reaching it)",
                urls.len()
            )));
        }
        Ok(Self(urls))
    }

    /// The URLs.
    pub fn urls(&self) -> &[Url] {
        &self.0
    }
}

impl WorkerDirectory for StaticWorkers {
    fn urls(&self) -> Result<Vec<Url>, DistributedError> {
        Ok(self.0.clone())
    }
}

/// Every address one DNS name resolves to, resolved again every few seconds in the
/// background: a Kubernetes headless Service (`dns+http://workers.pulpitum.svc:7600`), or
/// any name with one record per worker. An answer that fails or is empty keeps the last
/// good list (a brief DNS outage does not stop queries); before any good answer, queries
/// fail naming the name.
#[derive(Debug)]
pub struct DnsWorkers {
    name: String,
    urls: Arc<std::sync::RwLock<Result<Vec<Url>, String>>>,
    _refresh: tokio_util::sync::DropGuard,
}

/// How often [`DnsWorkers`] resolves its name again.
pub const DNS_REFRESH: std::time::Duration = std::time::Duration::from_secs(5);

impl DnsWorkers {
    /// Resolves `host:port` now and every [`DNS_REFRESH`]; worker URLs use `scheme`
    /// (`http` or `https`). Needs a Tokio runtime; the refresh stops when this is dropped.
    pub async fn start(scheme: &str, host: &str, port: u16) -> Self {
        let name = format!("{scheme}://{host}:{port}");
        let urls = Arc::new(std::sync::RwLock::new(Err(format!(
            "{name} has not resolved yet"
        ))));
        let resolve = {
            let (scheme, host, urls) = (scheme.to_string(), host.to_string(), urls.clone());
            move || {
                let (scheme, host, urls) = (scheme.clone(), host.clone(), urls.clone());
                async move {
                    let found = tokio::net::lookup_host((host.as_str(), port)).await;
                    let mut list: Vec<Url> = match found {
                        Ok(addrs) => addrs
                            .filter_map(|a| Url::parse(&format!("{scheme}://{a}")).ok())
                            .collect(),
                        Err(e) => {
                            let mut w = urls.write().expect("worker list poisoned");
                            if w.is_err() {
                                *w = Err(format!("{host}:{port} does not resolve: {e}"));
                            }
                            return;
                        }
                    };
                    list.sort();
                    list.dedup();
                    if !list.is_empty() {
                        *urls.write().expect("worker list poisoned") = Ok(list);
                    }
                }
            }
        };
        resolve().await;
        let stop = tokio_util::sync::CancellationToken::new();
        let token = stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(DNS_REFRESH) => resolve().await,
                }
            }
        });
        Self {
            name,
            urls,
            _refresh: stop.drop_guard(),
        }
    }
}

impl WorkerDirectory for DnsWorkers {
    fn urls(&self) -> Result<Vec<Url>, DistributedError> {
        self.urls
            .read()
            .expect("worker list poisoned")
            .clone()
            .map_err(|e| DistributedError::WorkerList(format!("{}: {e}", self.name)))
    }
}

/// What a coordinator needs to distribute: where the workers are, how it proves itself to
/// them (the secret they share, mutual TLS, or both), and how many archived buckets make
/// one task.
#[derive(Debug, Clone)]
pub struct DistributedSettings {
    /// The workers.
    pub workers: Arc<dyn WorkerDirectory>,
    /// The shared secret; `None` sends none (only workers started with
    /// `--insecure-no-auth` on loopback accept that).
    pub secret: Option<WorkerSecret>,
    /// Mutual TLS: worker URLs are then `https://`, and `http://` ones are refused.
    pub tls: Option<WorkerTls>,
    /// Archived buckets per task (at least 1): a scan of fewer stays in one task.
    pub buckets_per_task: usize,
}

impl DistributedSettings {
    /// Settings over `--workers` (see [`workers_of`]), with the secret from
    /// [`auth::SECRET_ENV`] and `tls`; a listed worker whose scheme does not match `tls` is
    /// refused now, before any query.
    pub async fn from_list(list: &str, tls: Option<WorkerTls>) -> Result<Self, DistributedError> {
        let workers = workers_of(list).await?;
        for url in workers.urls().unwrap_or_default() {
            tls::check_scheme(&url, tls.is_some())?;
        }
        Ok(Self {
            workers,
            secret: WorkerSecret::from_env()?,
            tls,
            buckets_per_task: DEFAULT_BUCKETS_PER_TASK,
        })
    }
}

/// The workers a `--workers` value names: one `dns+http://NAME:PORT` (or `dns+https://`)
/// entry for every address the name resolves to ([`DnsWorkers`]), else a fixed list
/// ([`StaticWorkers::parse`]).
pub async fn workers_of(list: &str) -> Result<Arc<dyn WorkerDirectory>, DistributedError> {
    let trimmed = list.trim();
    let Some(plain) = trimmed.strip_prefix("dns+") else {
        return Ok(Arc::new(StaticWorkers::parse(list)?));
    };
    if trimmed.contains(',') {
        return Err(DistributedError::WorkerList(
            "a dns+http:// entry names every worker by itself; give it alone".into(),
        ));
    }
    // Checked as the plain URL it stands for (a scheme, host, port, nothing else), beside a
    // stand-in of the same scheme: the two-worker check applies to what the name resolves
    // to, not to the one entry.
    let scheme = if plain.to_ascii_lowercase().starts_with("https:") {
        "https"
    } else {
        "http"
    };
    let parsed = StaticWorkers::parse(&format!("{plain},{scheme}://check.invalid:1"))?;
    let url = &parsed.urls()[0];
    let host = url.host_str().expect("checked by parse");
    let port = url.port_or_known_default().expect("an http URL has a port");
    Ok(Arc::new(DnsWorkers::start(url.scheme(), host, port).await))
}

/// datafusion-distributed's view of a [`WorkerDirectory`].
struct Resolver(Arc<dyn WorkerDirectory>);

impl WorkerResolver for Resolver {
    fn get_urls(&self) -> Result<Vec<Url>, DataFusionError> {
        let urls = self.0.urls()?;
        if urls.len() < 2 {
            return Err(DistributedError::WorkerList(format!(
                "{} worker(s) known ({:?}); a distributed query needs at least two (with \
                 one it would run here without reaching it)",
                urls.len(),
                self.0
            ))
            .into());
        }
        Ok(urls)
    }
}

/// `builder` planning distributed over `settings`' workers, decoding scans against
/// `tiers` (a coordinator decodes what it sent when a stage runs on itself). Call after
/// `with_config`: the handlers live in the configuration.
pub fn install(
    builder: SessionStateBuilder,
    settings: &DistributedSettings,
    tiers: Tiers,
) -> SessionStateBuilder {
    let mut builder = builder
        .with_distributed_worker_resolver(Resolver(settings.workers.clone()))
        .with_distributed_channel_resolver(auth::Channels::new(
            settings.secret.clone(),
            settings.tls.clone(),
        ))
        .with_distributed_planner()
        .with_distributed_user_codec(ScanCodec::new(tiers))
        .with_distributed_desired_task_count_handler(tasks::desired_task_count)
        .with_distributed_scale_up_leaf_node_handler(tasks::scale_up);
    match std::mem::take(builder.query_planner()) {
        Some(inner) => builder.with_query_planner(Arc::new(explain::ExplainStages { inner })),
        None => builder,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_dns_name_lists_every_address_it_resolves_to() {
        let w = workers_of("dns+http://localhost:7600").await.unwrap();
        let urls = w.urls().unwrap();
        assert!(!urls.is_empty());
        assert!(
            urls.iter()
                .all(|u| u.scheme() == "http" && u.port() == Some(7600)),
            "{urls:?}"
        );
        for list in ["dns+https://localhost:7600", "dns+HTTPS://localhost:7600"] {
            let tls = workers_of(list).await.unwrap();
            assert!(tls.urls().unwrap().iter().all(|u| u.scheme() == "https"));
        }
        let e = workers_of("dns+http://a:1,http://b:2").await.unwrap_err();
        assert!(e.to_string().contains("alone"), "{e}");
        let none = workers_of("dns+http://no-such-worker.invalid:7600")
            .await
            .unwrap();
        let e = none.urls().unwrap_err().to_string();
        assert!(e.contains("no-such-worker.invalid"), "{e}");
    }

    #[test]
    fn a_worker_list_takes_only_plain_worker_urls_and_names_the_bad_entry() {
        let ok = StaticWorkers::parse("http://10.0.0.1:7600, http://w2.internal").unwrap();
        assert_eq!(ok.urls().len(), 2);
        assert_eq!(ok.urls()[1].port_or_known_default(), Some(80));
        let tls = StaticWorkers::parse("https://w1.internal:7600,https://w2.internal").unwrap();
        assert_eq!(tls.urls()[1].port_or_known_default(), Some(443));
        for (list, says) in [
            ("http://a:1,,http://b:2", "entry 2 is empty"),
            ("a:1", "entry 1 has scheme"),
            ("localhost", "entry 1 is not a URL"),
            ("grpc://a:1", "scheme \"grpc\""),
            ("http://u:hunter22@a:1", "credentials"),
            ("http://a:1", "at least two"),
            ("http://a:1,http://a:1", "at least two"),
            (
                "https://a:1,http://b:2",
                "entry 2 is http:// but entry 1 is https://",
            ),
            ("http://a:1/x", "path"),
        ] {
            let e = StaticWorkers::parse(list).unwrap_err().to_string();
            assert!(e.contains(says), "{list}: {e}");
            assert!(!e.contains("hunter22"), "{e}");
        }
    }
}
