//! Connections that have not logged in yet: accepted, holding no connection slot.
//!
//! A connection takes one of the `--max-connections` slots only when its login completes,
//! so clients that connect, send a StartupMessage and then stay silent cannot hold the
//! slots real users need (a cancel request, which needs no slot, is served either way).
//! Until its login a connection costs a task and a socket, so these are bounded here: in
//! all, and per client address (a quarter of the total; IPv6 addresses count per /64, the
//! block one client usually holds), so that one address cannot keep every other client,
//! and their cancel requests, out. Every start ends at the startup timeout (and the part
//! before the StartupMessage at `conn::HANDSHAKE_TIMEOUT`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// The count of connections not yet logged in, in all and per address.
pub(super) struct Handshakes {
    limit: usize,
    per_address: usize,
    counts: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// One connection not yet logged in; dropping it ends its start.
pub(super) struct Handshake {
    of: Arc<Handshakes>,
    address: IpAddr,
}

/// The address a client is counted under: IPv4 as is (IPv4-mapped IPv6 as IPv4), IPv6 by
/// its /64 prefix.
fn counted_as(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut segments = v6.segments();
                segments[4..].fill(0);
                IpAddr::V6(segments.into())
            }
        },
    }
}

impl Handshakes {
    /// At most `limit` connections not yet logged in, `per_address` of them from one
    /// address.
    pub(super) fn new(limit: usize, per_address: usize) -> Self {
        Self {
            limit,
            per_address: per_address.clamp(1, limit.max(1)),
            counts: Mutex::new((0, HashMap::new())),
        }
    }

    /// The bounds for a server of `max_connections`: twice that in all (at least 64), a
    /// quarter of it per address.
    pub(super) fn for_server(max_connections: usize) -> Self {
        let limit = max_connections.saturating_mul(2).max(64);
        Self::new(limit, limit / 4)
    }

    /// Admits a connection from `address`, or `None` when the total or its address's share
    /// is taken.
    pub(super) fn enter(self: &Arc<Self>, address: IpAddr) -> Option<Handshake> {
        let address = counted_as(address);
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
    fn one_address_gets_its_share_and_permits_come_back() {
        let h = Arc::new(Handshakes::new(4, 2));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = h.enter(a).unwrap();
        let _a2 = h.enter(a).unwrap();
        assert!(h.enter(a).is_none(), "a's share is taken");
        let _b1 = h.enter(b).unwrap();
        let _b2 = h.enter(b).unwrap();
        assert!(
            h.enter("10.0.0.3".parse().unwrap()).is_none(),
            "the total is taken"
        );
        drop(a1);
        assert!(h.enter(a).is_some());
    }

    #[test]
    fn ipv6_counts_per_64_and_mapped_ipv4_as_ipv4() {
        let h = Arc::new(Handshakes::new(8, 1));
        let _one = h.enter("2001:db8:1:2::1".parse().unwrap()).unwrap();
        assert!(
            h.enter("2001:db8:1:2:ffff::9".parse().unwrap()).is_none(),
            "the same /64"
        );
        assert!(h.enter("2001:db8:1:3::1".parse().unwrap()).is_some());
        let _v4 = h.enter("192.0.2.7".parse().unwrap()).unwrap();
        assert!(h.enter("::ffff:192.0.2.7".parse().unwrap()).is_none());
        assert_eq!(Handshakes::for_server(100).per_address, 50);
        assert_eq!(Handshakes::for_server(2).per_address, 16);
    }
}
