//! A window claim's lease for the length of a compaction: renewed in the background, lost
//! (and the work stopped before writing more) on a refused renewal or once the local bound
//! passes. [`super::compact`] holds one per claimed window.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::store::{CompactionClaim, HotStore, StoreError};

use super::ArchiverError;

/// A window claim's lease, renewed in the background every third of it while the
/// compaction runs (reading a window's sources can take longer than one lease). As for
/// bucket claims (`super::lease`), the local bound counts each lease from the sending of
/// the statement that set it, so it never outlives the store's; past it, or on a refused
/// renewal, the claim is lost and the work stops before writing more.
pub(super) struct WindowLease {
    current: Arc<Mutex<CompactionClaim>>,
    lost: Arc<Mutex<Option<String>>>,
    handle: tokio::task::JoinHandle<()>,
}

impl Drop for WindowLease {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

impl WindowLease {
    pub(super) fn start(
        store: Arc<dyn HotStore>,
        claim: CompactionClaim,
        sent: Instant,
        lease: Duration,
        op_deadline: Duration,
    ) -> Self {
        let current = Arc::new(Mutex::new(claim));
        let lost: Arc<Mutex<Option<String>>> = Arc::default();
        let (cur, gone) = (current.clone(), lost.clone());
        let handle = tokio::spawn(async move {
            let mut valid_until = sent + lease;
            let mut next = sent + lease / 3;
            loop {
                tokio::time::sleep_until(next.into()).await;
                let attempt = Instant::now();
                if attempt >= valid_until {
                    *gone.lock().expect("lease lock") = Some("the lease ran out".into());
                    return;
                }
                let claim = cur.lock().expect("lease lock").clone();
                let deadline = op_deadline.min(valid_until - attempt);
                match tokio::time::timeout(deadline, store.renew_compaction(&claim, lease)).await {
                    Ok(Ok(c)) => {
                        *cur.lock().expect("lease lock") = c;
                        valid_until = attempt + lease;
                        next = attempt + lease / 3;
                    }
                    Ok(Err(e @ StoreError::StaleCompaction { .. })) => {
                        *gone.lock().expect("lease lock") = Some(e.to_string());
                        return;
                    }
                    // A transient failure: try again soon, within the bound.
                    _ => next = Instant::now() + (lease / 10).max(Duration::from_millis(50)),
                }
            }
        });
        Self {
            current,
            lost,
            handle,
        }
    }

    pub(super) fn claim(&self) -> CompactionClaim {
        self.current.lock().expect("lease lock").clone()
    }

    pub(super) fn check(&self) -> Result<(), ArchiverError> {
        match self.lost.lock().expect("lease lock").clone() {
            None => Ok(()),
            Some(reason) => {
                let c = self.claim();
                Err(ArchiverError::Store(StoreError::StaleCompaction {
                    table_id: c.table_id,
                    window_key: c.window_key,
                    generation: c.generation,
                    reason,
                }))
            }
        }
    }
}
