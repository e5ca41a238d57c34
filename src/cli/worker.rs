//! `pulpitum worker` and `--workers` as the command line gives them: the coordinator's
//! settings from the worker list, and a worker served until SIGTERM or SIGINT
//! ([`crate::distributed`] has the machinery).

use tokio::net::TcpListener;

use crate::distributed::{worker, DistributedSettings, Tiers, WorkerOptions};

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

/// The workers `--workers` (`PULPITUM_WORKERS`) names, if any, with `buckets_per_task`.
pub async fn settings(
    list: Option<&str>,
    buckets_per_task: usize,
) -> Result<Option<DistributedSettings>, String> {
    let Some(list) = list else {
        return Ok(None);
    };
    let mut settings = DistributedSettings::from_list(list)
        .await
        .map_err(|e| format!("--workers (PULPITUM_WORKERS): {e}"))?;
    settings.buckets_per_task = buckets_per_task.max(1);
    Ok(Some(settings))
}

/// Serves plan fragments on `listener` (bound by [`worker::bind`]) until SIGTERM or
/// SIGINT, announcing its address on standard error.
pub async fn serve(
    listener: TcpListener,
    opts: &WorkerOptions,
    tiers: Tiers,
) -> Result<(), String> {
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    eprintln!("pulpitum: worker listening on {addr}");
    let stop = async {
        super::serve::wait_for_stop_signal().await;
        eprintln!("pulpitum: worker stopping");
    };
    worker::serve_worker(listener, opts, tiers, stop)
        .await
        .map_err(|e| e.to_string())
}
