//! The owner lease of a claim, renewed in the background while the work runs.
//!
//! The store's clock decides when a lease expires: `expires_at = store now + lease` at the
//! moment the claim or renewal *commits*. This host cannot see that instant, only when it
//! sent the statement, which is earlier; so the local bound counts each lease from the
//! sending and is never later than the store's. A claim that took long to return has used
//! part of its lease already. Renewal is tried every third of the lease and, after a failed
//! attempt, again shortly after, until the local bound runs out: then `lost` fires and the
//! work stops before writing anything more under the claim (the store refuses it anyway).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::store::{Claim, HotStore, StoreError};

/// Renews a claim in the background until dropped.
pub(crate) struct LeaseKeeper {
    /// Fires when renewal failed for good or the local bound ran out.
    pub(crate) lost: CancellationToken,
    valid_until: Arc<Mutex<Instant>>,
    handle: tokio::task::JoinHandle<()>,
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        // Cancellation safety: whoever drops the work also stops renewing its lease.
        self.handle.abort();
    }
}

impl LeaseKeeper {
    /// Starts renewing `claim`, whose claim statement was sent at `sent`.
    pub(crate) fn start(
        store: Arc<dyn HotStore>,
        claim: Claim,
        sent: Instant,
        lease: Duration,
        op_deadline: Duration,
    ) -> Self {
        let lost = CancellationToken::new();
        let valid_until = Arc::new(Mutex::new(sent + lease));
        let (signal, valid) = (lost.clone(), valid_until.clone());
        let handle = tokio::spawn(async move {
            let mut current = claim;
            let mut next = sent + lease / 3;
            loop {
                tokio::time::sleep_until(next.into()).await;
                let attempt = Instant::now();
                let until = *valid.lock().expect("lease lock");
                if attempt >= until {
                    signal.cancel();
                    return;
                }
                // A renewal that cannot finish inside the current bound is worth nothing.
                let deadline = op_deadline.min(until - attempt);
                match tokio::time::timeout(deadline, store.renew(&current, lease)).await {
                    Ok(Ok(c)) => {
                        current = c;
                        *valid.lock().expect("lease lock") = attempt + lease;
                        next = attempt + lease / 3;
                    }
                    Ok(Err(
                        StoreError::StaleClaim { .. } | StoreError::InvalidTransition { .. },
                    )) => {
                        signal.cancel();
                        return;
                    }
                    // Transient (connection cut, deadline): retry soon, up to the bound.
                    _ => next = (Instant::now() + lease / 10).min(until),
                }
            }
        });
        Self {
            lost,
            valid_until,
            handle,
        }
    }

    /// Whether the claim is still ours by the local bound.
    pub(crate) fn holds(&self) -> bool {
        !self.lost.is_cancelled() && Instant::now() < *self.valid_until.lock().expect("lease lock")
    }
}
