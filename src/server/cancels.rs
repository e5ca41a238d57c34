//! The cancel registry: which statement a cancel request stops.
//!
//! A cancel request arrives on a connection of its own, with no login, carrying the process
//! id and secret key the target connection was given at its start. The registry maps each
//! logged-in connection's key to its statement slot, so a request with a matching key
//! cancels that connection's running statement and a wrong key does nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::conn::StatementSlot;

/// A connection's cancel key: its process id and secret.
pub(super) type CancelKey = (i32, Vec<u8>);

/// Cancel keys of logged-in connections, and the statement each would cancel.
#[derive(Default)]
pub(super) struct Cancels {
    by_key: Mutex<HashMap<CancelKey, Arc<StatementSlot>>>,
}

impl Cancels {
    pub(super) fn register(&self, pid: i32, key: Vec<u8>, slot: Arc<StatementSlot>) {
        self.by_key
            .lock()
            .expect("cancel registry lock")
            .insert((pid, key), slot);
    }

    pub(super) fn unregister(&self, pid: i32, key: &[u8]) {
        self.by_key
            .lock()
            .expect("cancel registry lock")
            .remove(&(pid, key.to_vec()));
    }

    /// Cancels the running statement of the connection with this key, if there is one.
    pub(super) fn cancel(&self, pid: i32, key: &[u8]) {
        let slot = self
            .by_key
            .lock()
            .expect("cancel registry lock")
            .get(&(pid, key.to_vec()))
            .cloned();
        if let Some(slot) = slot {
            slot.cancel();
        }
    }
}
