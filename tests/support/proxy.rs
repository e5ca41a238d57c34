//! A TCP proxy for network-fault tests: it forwards bytes both ways between the code under
//! test and a real service, and can be told to cut a connection at an exact protocol
//! message or to black-hole every connection (stop forwarding without closing).
//!
//! A PostgreSQL proxy parses the frontend framing (the untagged startup packet, then
//! one-byte tag and four-byte length per message) so that a rule can fire on one message,
//! for example the simple query `COMMIT` that follows a given statement. A raw proxy (for
//! S3's HTTP) only forwards chunks. Proxies that share one [`Partition`] are cut off and
//! healed together, as one worker's network would be. While partitioned, a chunk already
//! read is held and delivered after healing, as TCP retransmission would deliver it late.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

/// A switch shared by the proxies of one simulated host: while on, nothing is forwarded.
#[derive(Clone)]
pub struct Partition {
    on: Arc<watch::Sender<bool>>,
    /// Chunks read but not yet written because of the partition.
    held: Arc<AtomicUsize>,
}

impl Default for Partition {
    fn default() -> Self {
        Self {
            on: Arc::new(watch::channel(false).0),
            held: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl Partition {
    /// Stops forwarding on every connection of every proxy sharing this partition.
    pub fn black_hole(&self) {
        self.on.send_replace(true);
    }

    /// Resumes forwarding; held data is delivered.
    pub fn heal(&self) {
        self.on.send_replace(false);
    }

    /// Whether forwarding is stopped.
    pub fn is_on(&self) -> bool {
        *self.on.borrow()
    }

    /// Chunks currently held back by the partition.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    async fn wait_open(&self) {
        let mut rx = self.on.subscribe();
        if !*rx.borrow_and_update() {
            return;
        }
        // Counted until this returns or is dropped (its connection ended meanwhile).
        struct Held<'a>(&'a AtomicUsize);
        impl Drop for Held<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.held.fetch_add(1, Ordering::SeqCst);
        let _held = Held(&self.held);
        let _ = rx.wait_for(|on| !*on).await;
    }
}

/// What a rule does when its message passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Close both sides without forwarding the message (it never reaches the server).
    CutBefore,
    /// Forward the message, let the server answer it, and close both sides without
    /// relaying the answer: the server acted, the client cannot know.
    CutAfterReply,
    /// Turn the proxy's partition on and hold the message (delivered after healing).
    BlackHole,
}

/// A one-shot rule on client-to-server PostgreSQL messages: once a message containing
/// `arm` has passed on a connection, the next simple query whose text is `query` on that
/// same connection triggers `action`.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Text that arms the rule on a connection (matched in any message's body).
    pub arm: String,
    /// The simple query (`Q`) text that fires it, e.g. `COMMIT`.
    pub query: String,
    /// What to do.
    pub action: Action,
}

#[derive(Default)]
struct Rules {
    /// Rules not yet fired, each with an id that connections arm.
    pending: Mutex<Vec<(u64, Rule)>>,
    next_id: AtomicU64,
    /// Raw proxies: byte strings that, all found in one client chunk, black-hole it.
    raw_trigger: Mutex<Option<Vec<Vec<u8>>>>,
    fired: AtomicUsize,
    fired_signal: Notify,
}

impl Rules {
    fn note_fired(&self) {
        self.fired.fetch_add(1, Ordering::SeqCst);
        self.fired_signal.notify_waiters();
    }
}

/// A running proxy; dropping it stops accepting (open connections end with their peers).
pub struct Proxy {
    addr: SocketAddr,
    rules: Arc<Rules>,
    accepted: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Proxy {
    /// A PostgreSQL-aware proxy to `target`.
    pub async fn postgres(target: &str, partition: Partition) -> Self {
        Self::start(target, partition, true).await
    }

    /// A byte-forwarding proxy to `target` (HTTP, or anything else).
    pub async fn raw(target: &str, partition: Partition) -> Self {
        Self::start(target, partition, false).await
    }

    async fn start(target: &str, partition: Partition, postgres: bool) -> Self {
        let target: SocketAddr = target.parse().expect("proxy target is host:port");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().unwrap();
        let rules = Arc::new(Rules::default());
        let accepted = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let (r, a, s) = (rules.clone(), accepted.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let client = tokio::select! {
                    _ = s.cancelled() => return,
                    c = listener.accept() => match c {
                        Ok((c, _)) => c,
                        Err(_) => continue,
                    },
                };
                a.fetch_add(1, Ordering::SeqCst);
                let (r, p) = (r.clone(), partition.clone());
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    relay(client, server, p, r, postgres).await;
                });
            }
        });
        Self {
            addr,
            rules,
            accepted,
            stop,
        }
    }

    /// `host:port` to connect to instead of the target.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Adds a one-shot rule.
    pub fn add_rule(&self, rule: Rule) {
        let id = self.rules.next_id.fetch_add(1, Ordering::SeqCst);
        self.rules.pending.lock().unwrap().push((id, rule));
    }

    /// Raw proxies: black-holes the partition when one client chunk contains every one of
    /// `parts` (for example an HTTP request line's method and object name); one-shot.
    pub fn black_hole_on(&self, parts: &[&str]) {
        *self.rules.raw_trigger.lock().unwrap() =
            Some(parts.iter().map(|p| p.as_bytes().to_vec()).collect());
    }

    /// Rules fired so far.
    pub fn fired(&self) -> usize {
        self.rules.fired.load(Ordering::SeqCst)
    }

    /// Waits until `n` rules have fired, or panics after `within`.
    pub async fn wait_fired(&self, n: usize, within: Duration) {
        tokio::time::timeout(within, async {
            loop {
                let signal = self.rules.fired_signal.notified();
                if self.fired() >= n {
                    return;
                }
                signal.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{n} proxy rule(s) did not fire within {within:?}"));
    }
}

/// Per-connection state shared by its two directions.
struct Conn {
    kill: CancellationToken,
    /// Set by `CutAfterReply`: the server's next answer is swallowed, then both sides close.
    swallow_reply: std::sync::atomic::AtomicBool,
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    partition: Partition,
    rules: Arc<Rules>,
    postgres: bool,
) {
    let conn = Arc::new(Conn {
        kill: CancellationToken::new(),
        swallow_reply: false.into(),
    });
    let (client_rd, client_wr) = client.into_split();
    let (server_rd, server_wr) = server.into_split();
    let upstream = {
        let (conn, partition) = (conn.clone(), partition.clone());
        async move {
            if postgres {
                pg_upstream(client_rd, server_wr, &partition, &rules, &conn).await
            } else {
                raw_copy(client_rd, server_wr, &partition, Some(&rules)).await
            }
        }
    };
    let downstream = {
        let conn = conn.clone();
        async move { downstream(server_rd, client_wr, &partition, &conn).await }
    };
    // Either direction ending (EOF, error, or a cut) ends the connection: both halves drop.
    tokio::select! {
        _ = conn.kill.cancelled() => {}
        _ = upstream => {}
        _ = downstream => {}
    }
}

async fn raw_copy(
    mut rd: impl AsyncRead + Unpin,
    mut wr: impl AsyncWrite + Unpin,
    partition: &Partition,
    rules: Option<&Rules>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = rd.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        if let Some(rules) = rules {
            let chunk = &buf[..n];
            let mut trigger = rules.raw_trigger.lock().unwrap();
            let hit = trigger.as_ref().is_some_and(|parts| {
                parts
                    .iter()
                    .all(|p| chunk.windows(p.len()).any(|w| w == p.as_slice()))
            });
            if hit {
                *trigger = None;
                drop(trigger);
                partition.black_hole();
                rules.note_fired();
            }
        }
        partition.wait_open().await;
        wr.write_all(&buf[..n]).await?;
    }
}

/// Server to client. After a `CutAfterReply` fired, reads (and drops) until the server's
/// `ReadyForQuery` ('Z') for the cut message has arrived, then kills the connection. The
/// client has received every earlier answer before it sends `COMMIT`, so the bytes that
/// follow the trigger are that answer.
async fn downstream(
    mut rd: impl AsyncRead + Unpin,
    mut wr: impl AsyncWrite + Unpin,
    partition: &Partition,
    conn: &Conn,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = rd.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        if conn.swallow_reply.load(Ordering::SeqCst) {
            if contains_ready_for_query(&buf[..n]) {
                conn.kill.cancel();
                return Ok(());
            }
            continue;
        }
        partition.wait_open().await;
        wr.write_all(&buf[..n]).await?;
    }
}

/// Whether a chunk of backend messages contains a `ReadyForQuery`: the last message of the
/// answer to a simple query (tag 'Z', length 5, status byte).
fn contains_ready_for_query(chunk: &[u8]) -> bool {
    chunk
        .windows(5)
        .any(|w| w[0] == b'Z' && w[1..5] == 5u32.to_be_bytes())
}

const SSL_REQUEST: u32 = 80_877_103;
const GSS_REQUEST: u32 = 80_877_104;

/// Client to server, message by message.
async fn pg_upstream(
    mut rd: impl AsyncRead + Unpin,
    mut wr: impl AsyncWrite + Unpin,
    partition: &Partition,
    rules: &Rules,
    conn: &Conn,
) -> std::io::Result<()> {
    // Startup: untagged packets (length, then code). An SSL/GSS request is answered with a
    // single byte by the server and followed by another untagged packet.
    loop {
        let len = rd.read_u32().await?;
        let mut body = vec![0u8; (len as usize).saturating_sub(4)];
        rd.read_exact(&mut body).await?;
        let code = body
            .get(..4)
            .map_or(0, |c| u32::from_be_bytes(c.try_into().unwrap()));
        partition.wait_open().await;
        wr.write_all(&len.to_be_bytes()).await?;
        wr.write_all(&body).await?;
        if code != SSL_REQUEST && code != GSS_REQUEST {
            break;
        }
    }
    let mut armed: Vec<u64> = Vec::new();
    loop {
        let tag = rd.read_u8().await?;
        let len = rd.read_u32().await?;
        let mut msg = Vec::with_capacity(len as usize + 1);
        msg.push(tag);
        msg.extend_from_slice(&len.to_be_bytes());
        msg.resize(len as usize + 1, 0);
        rd.read_exact(&mut msg[5..]).await?;
        let action = match_rules(rules, &mut armed, tag, &msg[5..]);
        // The action takes effect before anyone waiting for it is told it fired.
        match action {
            None => {}
            Some(Action::CutBefore) => {
                conn.kill.cancel();
                rules.note_fired();
                return Ok(());
            }
            Some(Action::CutAfterReply) => conn.swallow_reply.store(true, Ordering::SeqCst),
            Some(Action::BlackHole) => partition.black_hole(),
        }
        if action.is_some() {
            rules.note_fired();
        }
        partition.wait_open().await;
        wr.write_all(&msg).await?;
    }
}

/// Arms rules whose `arm` text is in this message and returns the action of the first
/// armed rule this message fires (removing it: rules are one-shot). `armed` holds the ids
/// of the rules armed on this connection.
fn match_rules(rules: &Rules, armed: &mut Vec<u64>, tag: u8, body: &[u8]) -> Option<Action> {
    let mut pending = rules.pending.lock().unwrap();
    if tag == b'Q' {
        // Simple query: the text, NUL-terminated.
        let text = String::from_utf8_lossy(body.strip_suffix(&[0]).unwrap_or(body));
        let text = text.trim().trim_end_matches(';');
        if let Some(pos) = pending
            .iter()
            .position(|(id, r)| armed.contains(id) && r.query.eq_ignore_ascii_case(text))
        {
            let (id, rule) = pending.remove(pos);
            armed.retain(|&i| i != id);
            return Some(rule.action);
        }
    }
    let body = String::from_utf8_lossy(body);
    for (id, rule) in pending.iter() {
        if !armed.contains(id) && body.contains(&rule.arm) {
            armed.push(*id);
        }
    }
    None
}
