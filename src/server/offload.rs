//! Planning off the runtime's workers.
//!
//! DataFusion parses, plans and optimises a statement without ever yielding: a statement
//! within every limit of [`super::shape`] can still plan for seconds (a join of 90 relations
//! took 4.75 s in a debug build, 16 nested `coalesce` 2.8 s). On a tokio worker that is a
//! worker lost for the duration, and once every worker plans, nothing else on the runtime
//! moves: not new logins, not the listener, not a signal handler, not the timers (a review
//! saw new logins and SIGTERM wait 11 s behind two slow statements). [`off_worker`] runs such
//! work under `block_in_place`, which hands the worker's queue and the runtime's drivers to
//! another thread first, so the runtime keeps serving while this thread plans.
//!
//! Only planning goes there, never the sending of rows: a thread inside `block_in_place`
//! waiting on a client that does not read would be held for as long as the client likes,
//! and could not be aborted at shutdown (it never yields). And at most
//! [`MAX_OFF_WORKER`] pieces of work are off the workers at once (others wait for a turn
//! without holding a thread): each holds a thread of tokio's blocking pool (512 by default)
//! and a worker handed over needs one too, so a pool emptied by planners would leave the
//! runtime with no thread to run its workers on.
//!
//! The Execute of a prepared statement whose physical plan is cached for its values stays
//! on the worker, and so does an ad-hoc query whose shape has a plan cached for its values
//! ([`super::adhoc::run_cached`]): the hot page would pay the hand-off on every call for
//! nothing (on the wire bench, handing off every ad-hoc page made it 3.8x the direct
//! call's time instead of 2.6-3.1x).

use std::cell::Cell;
use std::future::Future;

use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::Semaphore;

/// Most pieces of work off the workers at once, server-wide.
pub(super) const MAX_OFF_WORKER: usize = 64;

static TURNS: Semaphore = Semaphore::const_new(MAX_OFF_WORKER);

thread_local! {
    /// Set while this thread runs work handed off by [`off_worker`]: a nested call runs its
    /// work in place (it is already off the workers, and its turn is taken).
    static OFF_WORKER: Cell<bool> = const { Cell::new(false) };
}

/// Runs `work` to its end on this thread with the worker's other duties handed to another
/// thread; on a current-thread runtime (where that is impossible), or nested inside another
/// call, runs it as is.
pub(super) async fn off_worker<F: Future>(work: F) -> F::Output {
    let handle = Handle::current();
    if handle.runtime_flavor() != RuntimeFlavor::MultiThread || OFF_WORKER.with(Cell::get) {
        return work.await;
    }
    let _turn = TURNS
        .acquire()
        .await
        .expect("the semaphore is never closed");
    tokio::task::block_in_place(move || {
        OFF_WORKER.with(|f| f.set(true));
        // Reset on unwind too: the thread goes back to being a worker or to the pool.
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                OFF_WORKER.with(|f| f.set(false));
            }
        }
        let _reset = Reset;
        handle.block_on(work)
    })
}
