//! Connections in their start: accepted, not yet holding a connection slot.
//!
//! The connection limit applies once a client has sent its StartupMessage (so that a cancel
//! request, which needs no slot, is still served when the server is full). Until then a
//! connection costs a task and a socket, so their number is bounded too: in all, and per
//! client address (half the total), so that one address opening sockets and sending nothing
//! cannot keep every other client, and its cancel requests, out. A start must also finish
//! quickly (see `conn::HANDSHAKE_TIMEOUT`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// The count of connections in their start, in all and per address.
pub(super) struct Handshakes {
    limit: usize,
    per_address: usize,
    counts: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// One connection in its start; dropping it ends the start.
pub(super) struct Handshake {
    of: Arc<Handshakes>,
    address: IpAddr,
}

impl Handshakes {
    /// At most `limit` connections in their start, half of them from one address.
    pub(super) fn new(limit: usize) -> Self {
        Self {
            limit,
            per_address: (limit / 2).max(1),
            counts: Mutex::new((0, HashMap::new())),
        }
    }

    /// Admits a connection from `address`, or `None` when the total or its address's share
    /// is taken.
    pub(super) fn enter(self: &Arc<Self>, address: IpAddr) -> Option<Handshake> {
        let mut counts = self.counts.lock().expect("handshake counts lock");
        let (total, by_address) = &mut *counts;
        let mine = by_address.entry(address).or_insert(0);
        if *total >= self.limit || *mine >= self.per_address {
            if *mine == 0 {
                by_address.remove(&address);
            }
            return None;
        }
        *total += 1;
        *mine += 1;
        Some(Handshake {
            of: self.clone(),
            address,
        })
    }
}

impl Drop for Handshake {
    fn drop(&mut self) {
        let mut counts = self.of.counts.lock().expect("handshake counts lock");
        let (total, by_address) = &mut *counts;
        *total -= 1;
        if let Some(n) = by_address.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                by_address.remove(&self.address);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_gets_half_and_permits_come_back() {
        let h = Arc::new(Handshakes::new(4));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = h.enter(a).unwrap();
        let _a2 = h.enter(a).unwrap();
        assert!(h.enter(a).is_none(), "a's half is taken");
        let _b1 = h.enter(b).unwrap();
        let _b2 = h.enter(b).unwrap();
        assert!(
            h.enter("10.0.0.3".parse().unwrap()).is_none(),
            "the total is taken"
        );
        drop(a1);
        assert!(h.enter(a).is_some());
    }
}
