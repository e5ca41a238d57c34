//! `pulpitum worker` and `--workers` as the command line gives them: the coordinator's
//! settings from the worker list, and a worker served until SIGTERM or SIGINT
//! ([`crate::distributed`] has the machinery).

use tokio::net::TcpListener;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::distributed::{
    worker, DistributedSettings, Tiers, WorkerMetrics, WorkerOptions, WorkerTls,
};

/// `--worker-tls-ca`, `--worker-tls-cert` and `--worker-tls-key` (or their variables), as
/// typed: all three or none.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// The CA every coordinator's and worker's certificate chains to.
    pub ca: Option<PathBuf>,
    /// This process's certificate chain.
    pub cert: Option<PathBuf>,
    /// Its private key.
    pub key: Option<PathBuf>,
    /// The name every worker's certificate is checked against, instead of the host dialled.
    pub server_name: Option<String>,
}

impl TlsFiles {
    /// The checked material, if the three are given.
    pub fn load(&self) -> Result<Option<WorkerTls>, String> {
        let tls = WorkerTls::from_settings(
            self.ca.as_deref(),
            self.cert.as_deref(),
            self.key.as_deref(),
        )
        .map_err(|e| e.to_string())?;
        match (tls, &self.server_name) {
            (tls, None) => Ok(tls),
            (Some(tls), Some(name)) => tls
                .with_server_name(name)
                .map(Some)
                .map_err(|e| e.to_string()),
            (None, Some(_)) => Err(
                "--worker-tls-server-name (PULPITUM_WORKER_TLS_SERVER_NAME) needs mutual TLS: \
                 set --worker-tls-ca, --worker-tls-cert and --worker-tls-key too"
                    .into(),
            ),
        }
    }
}

/// The coordinator's flags: a worker takes limits and task sizes from each plan it is
/// sent, so typed with `worker` they are refused (their variables may sit in an
/// environment file shared with a coordinator, and are ignored).
pub const COORDINATOR_FLAGS: [&str; 5] = [
    "max_rows",
    "max_bytes",
    "max_duration_ms",
    "workers",
    "buckets_per_task",
];

/// The workers `--workers` (`PULPITUM_WORKERS`) names, if any, with `buckets_per_task`
/// and mutual TLS when `tls` names its files.
pub async fn settings(
    list: Option<&str>,
    buckets_per_task: usize,
    tls: &TlsFiles,
) -> Result<Option<DistributedSettings>, String> {
    let Some(list) = list else {
        return Ok(None);
    };
    let mut settings = DistributedSettings::from_list(list, tls.load()?)
        .await
        .map_err(|e| format!("--workers (PULPITUM_WORKERS): {e}"))?;
    settings.buckets_per_task = buckets_per_task.max(1);
    Ok(Some(settings))
}

/// How long a stopping worker lets running tasks finish.
pub const DRAIN: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves plan fragments on `listener` (bound by [`worker::bind`]) until SIGTERM or
/// SIGINT (then at most [`DRAIN`] more), announcing its address on standard error, with its metrics and `/healthz` on
/// `metrics_addr` when given.
pub async fn serve(
    listener: TcpListener,
    opts: &WorkerOptions,
    tiers: Tiers,
    metrics_addr: Option<SocketAddr>,
) -> Result<(), String> {
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let metrics = Arc::new(WorkerMetrics::default());
    let exposition = match metrics_addr {
        None => None,
        Some(at) => {
            let m = metrics.clone();
            let (bound, task) = crate::exposition::serve(at, move |path| m.answer(path))
                .await
                .map_err(|e| format!("--metrics-addr {at}: {e}"))?;
            eprintln!("pulpitum: worker metrics on {bound}");
            Some(task)
        }
    };
    eprintln!("pulpitum: worker listening on {addr}");
    let (stopping, stopped) = tokio::sync::oneshot::channel::<()>();
    let stop = async move {
        super::serve::wait_for_stop_signal().await;
        eprintln!("pulpitum: worker stopping");
        let _ = stopping.send(());
    };
    // Tasks running at the signal get DRAIN to finish; a connection that never speaks (or
    // a coordinator holding one open) does not keep the process alive past it.
    let drained = async {
        if stopped.await.is_ok() {
            tokio::time::sleep(DRAIN).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let served = tokio::select! {
        served = worker::serve_worker(listener, opts, tiers, metrics, stop) => served,
        () = drained => {
            eprintln!(
                "pulpitum: worker stopped with connections still open {} s after the signal",
                DRAIN.as_secs()
            );
            Ok(())
        }
    };
    if let Some(task) = exposition {
        task.abort();
    }
    served.map_err(|e| e.to_string())
}
