//! Planning off the runtime's workers.
//!
//! DataFusion parses, plans and optimises a statement without ever yielding: a statement
//! within every limit of [`super::shape`] can still plan for seconds (a join of many
//! relations, a constant-folded function that is slow). On a tokio worker that is a worker
//! lost for the duration, and once every worker plans, nothing else on the runtime moves:
//! not new logins, not the listener, not a signal handler, not the timers (a review saw new
//! logins and SIGTERM wait 11 s behind two slow statements). [`off_worker`] runs such work
//! under `block_in_place`, which hands the worker's queue and the runtime's drivers to
//! another thread first, so the runtime keeps serving while this thread plans.
//!
//! It wraps the work that can plan (a Query message, a Parse, an Execute whose plan is not
//! cached), not the Execute of a prepared statement already planned: the hot page would
//! pay the hand-off on every call for nothing.

use std::future::Future;

use tokio::runtime::{Handle, RuntimeFlavor};

/// Runs `work` to its end on this thread with the worker's other duties handed to another
/// thread; on a current-thread runtime (where that is impossible) runs it as is.
pub(super) async fn off_worker<F: Future>(work: F) -> F::Output {
    let handle = Handle::current();
    if handle.runtime_flavor() == RuntimeFlavor::MultiThread {
        tokio::task::block_in_place(move || handle.block_on(work))
    } else {
        work.await
    }
}
