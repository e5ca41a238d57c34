//! Memory limits of the wire server: one pool for the whole server, and a share of it per
//! connection (a connection runs one statement at a time, so that share bounds a query).
//!
//! DataFusion's operators that buffer (sorts, aggregations, joins, the cross join's left
//! side) reserve what they hold from their session's [`MemoryPool`]; a reservation the pool
//! refuses makes a spilling operator spill and any other fail with `ResourcesExhausted`,
//! which the server answers with SQLSTATE 53200 naming the limit. A connection's pool is a
//! [`QueryPool`]: it refuses past its own limit, and draws everything it grants from the
//! server's pool, so many moderate queries cannot together exceed the server's limit
//! either. Result rows are not held at all: they stream to the client batch by batch.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::memory_pool::{
    GreedyMemoryPool, MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
};

/// Formats a byte count for messages (`1.5 GiB`).
pub fn human(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// Parses a size: a number of bytes, or a number with `KiB`, `MiB`, `GiB`, `TiB` (or `K`,
/// `M`, `G`, `T`, `KB`, `MB`, `GB`, `TB`, all powers of 1024).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (e.g. 4GiB, 512MiB, 1073741824)"))?;
    let factor: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (bytes, KiB, MiB, GiB or TiB)"
            ))
        }
    };
    let bytes = n * factor;
    if !(1.0..=(usize::MAX as f64)).contains(&bytes) {
        return Err(format!("{text:?} is out of range"));
    }
    Ok(bytes as usize)
}

/// The machine's memory as the process may use it: the cgroup limit when one is set and
/// lower, else the physical memory (Linux); `None` when neither can be read.
pub fn machine_memory() -> Option<usize> {
    let physical = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
            .map(|kib| kib * 1024)
    });
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok());
    match (physical, cgroup) {
        (Some(p), Some(c)) => Some(p.min(c)),
        (p, c) => p.or(c),
    }
}

/// The default server limit: half of the machine's memory (4 GiB when it cannot be read).
pub fn default_server_limit() -> usize {
    machine_memory().map_or(4 << 30, |m| m / 2)
}

/// The server's pool: every connection's reservations together stay under its limit.
#[derive(Debug)]
pub struct ServerPool {
    inner: GreedyMemoryPool,
    limit: usize,
}

impl ServerPool {
    /// A pool of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            inner: GreedyMemoryPool::new(limit),
            limit,
        }
    }
}

impl fmt::Display for ServerPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "server pool of {}", human(self.limit))
    }
}

impl MemoryPool for ServerPool {
    fn name(&self) -> &str {
        "pulpitum-server"
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.inner.grow(reservation, additional)
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.inner.shrink(reservation, shrink)
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> DFResult<()> {
        self.inner.try_grow(reservation, additional).map_err(|_| {
            DataFusionError::ResourcesExhausted(format!(
                "out of memory: the server's queries together hold {} of its {} limit \
                 (--memory-limit) and {} needs {} more",
                human(self.inner.reserved()),
                human(self.limit),
                reservation.consumer().name(),
                human(additional)
            ))
        })
    }

    fn reserved(&self) -> usize {
        self.inner.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit)
    }
}

/// One connection's pool: at most `limit` bytes at a time, each drawn from the server's.
#[derive(Debug)]
pub struct QueryPool {
    limit: usize,
    used: AtomicUsize,
    server: Arc<dyn MemoryPool>,
}

impl QueryPool {
    /// A share of at most `limit` bytes of `server`.
    pub fn new(limit: usize, server: Arc<dyn MemoryPool>) -> Self {
        Self {
            limit,
            used: AtomicUsize::new(0),
            server,
        }
    }
}

impl fmt::Display for QueryPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "query pool of {}", human(self.limit))
    }
}

impl MemoryPool for QueryPool {
    fn name(&self) -> &str {
        "pulpitum-query"
    }

    fn register(&self, consumer: &MemoryConsumer) {
        self.server.register(consumer)
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.server.unregister(consumer)
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.used.fetch_add(additional, Ordering::Relaxed);
        self.server.grow(reservation, additional)
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.used.fetch_sub(shrink, Ordering::Relaxed);
        self.server.shrink(reservation, shrink)
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> DFResult<()> {
        let granted = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(additional).filter(|n| *n <= self.limit)
            });
        if let Err(used) = granted {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "out of memory: this query holds {} of its {} limit (--query-memory-limit) \
                 and {} needs {} more",
                human(used),
                human(self.limit),
                reservation.consumer().name(),
                human(additional)
            )));
        }
        if let Err(e) = self.server.try_grow(reservation, additional) {
            self.used.fetch_sub(additional, Ordering::Relaxed);
            return Err(e);
        }
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_size("512 MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("1048576").unwrap(), 1 << 20);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("4 parsecs").is_err());
        assert!(parse_size("0").is_err());
        assert_eq!(human(3 << 29), "1.5 GiB");
        assert_eq!(human(12), "12 bytes");
    }

    #[test]
    fn a_query_is_held_to_its_share_and_the_server_to_its_whole() {
        let server: Arc<dyn MemoryPool> = Arc::new(ServerPool::new(1000));
        let a: Arc<dyn MemoryPool> = Arc::new(QueryPool::new(600, server.clone()));
        let b: Arc<dyn MemoryPool> = Arc::new(QueryPool::new(600, server.clone()));
        let ra = MemoryConsumer::new("sort a").register(&a);
        let rb = MemoryConsumer::new("sort b").register(&b);
        ra.try_grow(500).unwrap();
        let e = ra.try_grow(200).unwrap_err().to_string();
        assert!(e.contains("--query-memory-limit"), "{e}");
        assert_eq!(a.reserved(), 500);
        // b fits its own share but not what the server has left.
        let e = rb.try_grow(550).unwrap_err().to_string();
        assert!(e.contains("--memory-limit"), "{e}");
        assert_eq!(b.reserved(), 0, "a refused grant is not counted");
        rb.try_grow(500).unwrap();
        assert_eq!(server.reserved(), 1000);
        drop(ra);
        assert_eq!(server.reserved(), 500);
    }
}
