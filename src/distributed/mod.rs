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
//! coordinator would. Only scans of archived buckets are split; hot rows are read by the
//! coordinator. Coordinator and workers share a secret ([`auth`]).
//!
//! A worker that fails or vanishes mid-query fails the query with an error naming it: the
//! engine retries no task, and the coordinator never falls back to reading locally.

pub mod auth;
pub mod codec;
mod explain;
pub mod tasks;
pub mod worker;

use std::fmt;
use std::sync::Arc;

use datafusion::error::DataFusionError;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion_distributed::{DistributedExt, SessionStateBuilderExt, WorkerResolver};
use url::Url;

pub use auth::WorkerSecret;
pub use codec::{ScanCodec, Tiers};
pub use tasks::TaskScanExec;
pub use worker::{serve_worker, WorkerOptions};

/// Buckets one task reads, unless the settings say otherwise.
pub const DEFAULT_BUCKETS_PER_TASK: usize = 64;

/// The name of the coordinator's own in-process worker (never dialed: `.invalid` cannot
/// resolve).
const LOCAL_WORKER_URL: &str = "http://coordinator.pulpitum.invalid:1";

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
    /// Parses `http://host:port,https://host:port,...`: every entry a URL with a scheme of
    /// `http` or `https`, a host and a port, and nothing else (no user, path or query; a
    /// password in a URL would end up in logs).
    pub fn parse(list: &str) -> Result<Self, DistributedError> {
        let mut urls = Vec::new();
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
            if !matches!(url.scheme(), "http" | "https") {
                return Err(DistributedError::WorkerList(format!(
                    "entry {n} has scheme {:?}; a worker is reached over http:// or https://",
                    url.scheme()
                )));
            }
            if !url.username().is_empty() || url.password().is_some() {
                return Err(DistributedError::WorkerList(format!(
                    "entry {n} holds credentials; the secret goes in {}",
                    auth::SECRET_ENV
                )));
            }
            if url.host_str().is_none_or(str::is_empty) || url.port().is_none() {
                return Err(DistributedError::WorkerList(format!(
                    "entry {n} needs a host and an explicit port (http://HOST:PORT)"
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

/// What a coordinator needs to distribute: where the workers are, the secret they share,
/// and how many archived buckets make one task.
#[derive(Debug, Clone)]
pub struct DistributedSettings {
    /// The workers.
    pub workers: Arc<dyn WorkerDirectory>,
    /// The shared secret; `None` sends none (only workers started with
    /// `--insecure-no-auth` on loopback accept that).
    pub secret: Option<WorkerSecret>,
    /// Archived buckets per task (at least 1): a scan of fewer stays in one task.
    pub buckets_per_task: usize,
}

impl DistributedSettings {
    /// Settings over a fixed list, with the secret from [`auth::SECRET_ENV`].
    pub fn from_list(list: &str) -> Result<Self, DistributedError> {
        Ok(Self {
            workers: Arc::new(StaticWorkers::parse(list)?),
            secret: WorkerSecret::from_env()?,
            buckets_per_task: DEFAULT_BUCKETS_PER_TASK,
        })
    }
}

/// datafusion-distributed's view of a [`WorkerDirectory`].
struct Resolver(Arc<dyn WorkerDirectory>);

impl WorkerResolver for Resolver {
    fn get_urls(&self) -> Result<Vec<Url>, DataFusionError> {
        let urls = self.0.urls()?;
        if urls.is_empty() {
            return Err(DistributedError::WorkerList(format!(
                "no worker is listed ({:?})",
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
    // Stages of one task (a scan that stays whole: hot buckets, a page, a change's read)
    // run here, in process: datafusion-distributed places a single-task stage on the
    // coordinator when it has a local worker, and never dials its URL.
    let local = worker::plan_worker(tiers.clone(), settings.secret.clone())
        .to_local_worker_context(Url::parse(LOCAL_WORKER_URL).expect("a valid URL"));
    let mut builder = builder
        .with_distributed_local_worker_context(local)
        .with_distributed_worker_resolver(Resolver(settings.workers.clone()))
        .with_distributed_channel_resolver(auth::Channels::new(settings.secret.clone()))
        .with_distributed_planner()
        .with_distributed_user_codec(ScanCodec::new(tiers))
        .with_distributed_desired_task_count_handler(tasks::desired_task_count)
        .with_distributed_scale_up_leaf_node_handler(tasks::scale_up)
        .with_distributed_route_tasks_handler(tasks::route_tasks);
    match std::mem::take(builder.query_planner()) {
        Some(inner) => builder.with_query_planner(Arc::new(explain::ExplainStages { inner })),
        None => builder,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_list_takes_only_plain_worker_urls_and_names_the_bad_entry() {
        let ok = StaticWorkers::parse("http://10.0.0.1:7600, https://w2.internal:7600").unwrap();
        assert_eq!(ok.urls().len(), 2);
        for (list, says) in [
            ("http://a:1,,http://b:2", "entry 2 is empty"),
            ("a:1", "entry 1 has scheme"),
            ("localhost", "entry 1 is not a URL"),
            ("grpc://a:1", "scheme \"grpc\""),
            ("http://u:hunter22@a:1", "credentials"),
            ("http://a", "explicit port"),
            ("http://a:1/x", "path"),
        ] {
            let e = StaticWorkers::parse(list).unwrap_err().to_string();
            assert!(e.contains(says), "{list}: {e}");
            assert!(!e.contains("hunter22"), "{e}");
        }
    }
}
