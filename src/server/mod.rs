//! `pulpitum serve`: the PostgreSQL wire protocol over the tables of the shell's session, so
//! psql, drivers and BI tools query Pulpitum tables (and the control plane's system tables)
//! as they would a PostgreSQL database.
//!
//! The protocol is pgwire's and the DataFusion glue datafusion-postgres's; this module keeps
//! their unsafe defaults out (docs/server.md has the threat model):
//!
//! - **The connection** ([`conn`]): our own loop around pgwire's message dispatch. Nothing
//!   runs before the login has succeeded, a FATAL error closes the connection, every frame
//!   is checked before pgwire decodes it ([`frames`]), a cancel request is served before the
//!   connection limit, and nothing sent in the clear reaches a TLS session.
//! - **Authentication** ([`auth`]): SCRAM-SHA-256 against configured users, each with a
//!   role ([`guard::Role`]). Without users the server refuses to start, unless
//!   `--insecure-no-auth` is given and the address is loopback.
//! - **TLS** ([`tls`]): from PEM files; a configuration that cannot be loaded stops the start
//!   (never a silent plaintext fallback), and with TLS configured a plaintext client is
//!   refused.
//! - **What runs** ([`guard`], [`vars`]): decided on the planned statement, by role; no DDL
//!   of any kind and no file access; `SET` only from an allow-list. Each connection has its
//!   own session over the shared catalog and caches, so nothing one client sets reaches
//!   another.
//! - **Limits**: a connection limit (SQLSTATE 53300), a startup timeout, a per-statement
//!   timeout and the client's cancel request (57014) that stop execution and the rows still
//!   streaming, and memory pools ([`memory`]) for the server and for each query (53200).
//!   Results stream to the client as the socket takes them.
//! - **Shutdown**: on the token (SIGTERM in the binary), the listener closes at once and
//!   connections get a grace period to finish their statements; what remains is closed.

mod adhoc;
pub mod auth;
mod cancels;
mod conn;
mod cursors;
mod execute;
pub mod frames;
pub mod guard;
mod handlers;
mod handshake;
mod hooks;
mod limits;
pub mod memory;
mod offload;
mod params;
mod planned;
mod respond;
mod retained;
mod several;
mod shape;
mod sqlstate;
mod text;
pub mod tls;
pub mod vars;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use datafusion::execution::memory_pool::MemoryPool;
use datafusion::prelude::SessionContext;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use datafusion_postgres::datafusion_pg_catalog::setup_pg_catalog;
use datafusion_postgres::{DfSessionService, QueryHook};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use auth::Users;
pub use guard::Role;

/// The default listen address: loopback, one port above PostgreSQL's.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:5433";

/// Every way starting or running the server can fail.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A setting is missing, malformed or unsafe.
    #[error("invalid server setting {setting}: {reason}")]
    Config {
        /// The setting.
        setting: &'static str,
        /// What is wrong, and what is accepted.
        reason: String,
    },
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// Preparing the session for PostgreSQL clients failed.
    #[error("cannot set up the PostgreSQL catalog emulation: {0}")]
    Catalog(String),
    /// Writing to a client failed.
    #[error("connection error: {0}")]
    Io(String),
}

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `HOST:PORT` to listen on.
    pub listen: String,
    /// Users allowed to connect; `None` with `insecure_no_auth` lets anyone in (loopback only).
    pub users: Option<Users>,
    /// Explicit consent to run without authentication (refused on a non-loopback address).
    pub insecure_no_auth: bool,
    /// PEM certificate chain and private key; when set, TLS is required of every client.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Connections served at once; the next one is refused with SQLSTATE 53300.
    pub max_connections: usize,
    /// Longest a connection may take from its first byte to a completed login.
    pub startup_timeout: Duration,
    /// Longest a statement may run (planning, execution and sending its rows); `None`: no
    /// limit.
    pub statement_timeout: Option<Duration>,
    /// How long running statements may take to finish after shutdown begins.
    pub shutdown_grace: Duration,
    /// Memory all queries together may reserve, in bytes.
    pub memory_limit: usize,
    /// Memory one query may reserve, in bytes (at most `memory_limit`).
    pub query_memory_limit: usize,
    /// Longest Query, Parse, Bind or CopyData message, in bytes.
    pub max_message_bytes: usize,
    /// Which threads run the connections.
    pub runtime: ConnectionRuntime,
}

/// Which tokio runtime runs the connections' tasks (and so plans and runs their statements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConnectionRuntime {
    /// A runtime of the server's own, made by [`runtime_builder`]: safe whatever runtime the
    /// caller has, at the price of a hop between runtimes on every statement. The hot store's
    /// connections are driven by the runtime that opened them (the caller's, at start), so
    /// each statement's request and answer cross from one runtime's threads to the other's
    /// and back: measured by `cargo bench --bench wire` with `pulpitum serve` as a process,
    /// 2.78x-2.81x of a direct PostgreSQL page against 2.46x-2.58x on one runtime (see
    /// docs/benchmarks.md). The default, for embedders whose runtime was not built for it.
    #[default]
    Own,
    /// The runtime [`Server::run`] is called on, what `pulpitum serve` uses: no hop. It must
    /// be a multi-threaded runtime whose threads have at least [`CONNECTION_STACK_BYTES`] of
    /// stack: build it with [`runtime_builder`]. A smaller stack can overflow planning a
    /// statement that [`shape`] lets through, which aborts the process; on a current-thread
    /// runtime, a statement that plans slowly holds every other task of the runtime (the
    /// accept loop, the caller's signal handlers) until it is planned, since planning never
    /// yields and only a multi-threaded runtime can hand a worker's duties to another
    /// thread while one plans ([`offload`]).
    Caller,
}

/// A multi-threaded runtime whose worker threads have [`CONNECTION_STACK_BYTES`] of stack:
/// the one the server makes for itself, and the one to build for
/// [`ConnectionRuntime::Caller`].
pub fn runtime_builder() -> tokio::runtime::Builder {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder
        .thread_stack_size(CONNECTION_STACK_BYTES)
        .enable_all();
    builder
}

/// Why `sql` is refused before it is parsed, if it is: the shape check the wire server
/// applies to every statement ([`shape`]), for front ends that run statements outside it
/// (the shell), so a text that would overflow a stack or plan for ever is refused there
/// too, with the server's message.
pub fn shape_refusal(sql: &str) -> Option<String> {
    match shape::check(sql) {
        Ok(_) => None,
        Err(datafusion_postgres::pgwire::error::PgWireError::UserError(info)) => {
            Some(info.message.clone())
        }
        Err(e) => Some(e.to_string()),
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        let memory_limit = memory::default_server_limit();
        Self {
            listen: DEFAULT_LISTEN.into(),
            users: None,
            insecure_no_auth: false,
            tls: None,
            max_connections: 100,
            startup_timeout: Duration::from_secs(30),
            statement_timeout: Some(Duration::from_secs(300)),
            shutdown_grace: Duration::from_secs(10),
            memory_limit,
            query_memory_limit: memory_limit / 4,
            max_message_bytes: frames::DEFAULT_MAX_MESSAGE_BYTES,
            runtime: ConnectionRuntime::Own,
        }
    }
}

/// What every connection shares: the base session (catalog, caches), users, TLS, limits.
pub(crate) struct Shared {
    base: SessionContext,
    users: Option<Arc<Users>>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    config: ServerConfig,
    slots: Arc<Semaphore>,
    pool: Arc<dyn MemoryPool>,
    cancels: cancels::Cancels,
    /// The parser used before a login (never, in practice): its only hook refuses.
    refusing: Arc<DfSessionService>,
    /// Process ids and cancel keys for every connection: ids unique for the server's life
    /// (pgwire's default gives every connection the same first id), keys random.
    pids: Arc<datafusion_postgres::pgwire::api::RandomPidSecretKeyGenerator>,
}

/// Stack of the threads that run connections: planning and optimising recurse over a
/// statement's expression tree, and [`shape`] bounds that depth with this stack in mind.
pub const CONNECTION_STACK_BYTES: usize = 32 << 20;

/// A bound server, ready to run.
pub struct Server {
    /// Taken by `run`, dropped when shutdown begins (new connections are refused at once).
    listener: Option<TcpListener>,
    shared: Arc<Shared>,
    /// Connections between accept and their login (they hold no slot yet).
    handshakes: Arc<handshake::Handshakes>,
    /// The connections' own runtime ([`ConnectionRuntime::Own`]), whatever runtime the
    /// caller runs `run` on: its threads have [`CONNECTION_STACK_BYTES`] of stack. `None`
    /// when the caller's runtime runs them.
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Server {
    fn drop(&mut self) {
        // A runtime may not be dropped from async code; let it wind down on its own.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

fn config_error(setting: &'static str, reason: String) -> ServerError {
    ServerError::Config { setting, reason }
}

impl Server {
    /// Checks the configuration, sets up the catalog emulation on `ctx` and binds the
    /// address. Nothing is served until [`Server::run`].
    pub async fn bind(ctx: SessionContext, config: ServerConfig) -> Result<Self, ServerError> {
        if config.max_connections == 0 {
            return Err(config_error(
                "--max-connections",
                "must be at least 1".into(),
            ));
        }
        if config.query_memory_limit == 0 || config.query_memory_limit > config.memory_limit {
            return Err(config_error(
                "--query-memory-limit",
                format!(
                    "{} must be above 0 and at most --memory-limit ({})",
                    memory::human(config.query_memory_limit),
                    memory::human(config.memory_limit)
                ),
            ));
        }
        if config.max_message_bytes < frames::MAX_SMALL_BYTES {
            return Err(config_error(
                "--max-message-bytes",
                format!("must be at least {}", frames::MAX_SMALL_BYTES),
            ));
        }
        let tls = match &config.tls {
            Some((cert, key)) => Some(tls::acceptor(cert, key)?),
            None => None,
        };
        let listener =
            TcpListener::bind(&config.listen)
                .await
                .map_err(|source| ServerError::Bind {
                    addr: config.listen.clone(),
                    source,
                })?;
        let local = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: config.listen.clone(),
            source,
        })?;
        let users = match (&config.users, config.insecure_no_auth) {
            (Some(u), false) if !u.is_empty() => Some(Arc::new(u.clone())),
            (Some(_), true) => {
                return Err(config_error(
                    "--insecure-no-auth",
                    "users are configured too; choose one".into(),
                ))
            }
            (_, true) if !local.ip().is_loopback() => {
                return Err(config_error(
                    "--insecure-no-auth",
                    format!(
                        "{local} is not a loopback address; without authentication the server \
                         only listens on 127.0.0.1 or ::1"
                    ),
                ))
            }
            (_, true) => None,
            _ => {
                return Err(config_error(
                    "users",
                    "no user is configured: give --users-file, or PULPITUM_SERVER_USER, \
                     PULPITUM_SERVER_PASSWORD and PULPITUM_SERVER_ROLE (or --insecure-no-auth \
                     on a loopback address)"
                        .into(),
                ))
            }
        };
        setup_pg_catalog(&ctx, "datafusion", EmptyContextProvider)
            .map_err(|e| ServerError::Catalog(e.to_string()))?;
        let refusing_hooks: Vec<Arc<dyn QueryHook>> = vec![Arc::new(hooks::Unhandled)];
        let refusing = Arc::new(DfSessionService::new_with_hooks(
            Arc::new(ctx.clone()),
            refusing_hooks,
        ));
        let handshakes = Arc::new(handshake::Handshakes::for_server(config.max_connections));
        let runtime = match config.runtime {
            ConnectionRuntime::Own => Some(
                runtime_builder()
                    .thread_name("pulpitum-conn")
                    .build()
                    .map_err(|e| {
                        ServerError::Io(format!("cannot start the connection threads: {e}"))
                    })?,
            ),
            ConnectionRuntime::Caller => None,
        };
        Ok(Self {
            runtime,
            listener: Some(listener),
            shared: Arc::new(Shared {
                base: ctx,
                users,
                tls,
                slots: Arc::new(Semaphore::new(config.max_connections)),
                pool: Arc::new(memory::ServerPool::new(config.memory_limit)),
                cancels: cancels::Cancels::default(),
                refusing,
                pids: Arc::new(Default::default()),
                config,
            }),
            handshakes,
        })
    }

    /// The address actually bound (port 0 picks a free one).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match &self.listener {
            Some(l) => l.local_addr(),
            None => Err(std::io::Error::other("the server has stopped")),
        }
    }

    /// Serves until `shutdown` fires, then stops accepting and gives running connections
    /// the grace period before closing them.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut running = JoinSet::new();
        let listener = self.listener.take().expect("run is called once");
        let handle = match &self.runtime {
            Some(own) => own.handle().clone(),
            None => tokio::runtime::Handle::current(),
        };
        let mut backoff = Duration::ZERO;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(_) = running.join_next(), if !running.is_empty() => {}
                accepted = listener.accept() => {
                    let (socket, peer) = match accepted {
                        Ok(a) => {
                            backoff = Duration::ZERO;
                            a
                        }
                        Err(e) => {
                            // Out of descriptors (EMFILE) and the like: accepting again at once
                            // would spin; wait, longer each time, up to a second.
                            backoff = (backoff * 2).clamp(Duration::from_millis(5), Duration::from_secs(1));
                            warn!(error = %e, retry_ms = backoff.as_millis() as u64, "accept failed");
                            tokio::select! {
                                _ = shutdown.cancelled() => break,
                                _ = tokio::time::sleep(backoff) => {}
                            }
                            continue;
                        }
                    };
                    let Some(handshake) = self.handshakes.enter(peer.ip()) else {
                        warn!(%peer, "connection dropped: too many connections are starting");
                        continue;
                    };
                    // Moved to the connections' runtime (its reactor, its large stacks).
                    let Ok(socket) = socket.into_std() else {
                        continue;
                    };
                    let shared = self.shared.clone();
                    running.spawn_on(
                        async move {
                            if let Ok(socket) = tokio::net::TcpStream::from_std(socket) {
                                conn::serve(socket, peer, shared, handshake).await;
                            }
                        },
                        &handle,
                    );
                }
            }
        }
        drop(listener);
        info!(
            connections = running.len(),
            grace_ms = self.shared.config.shutdown_grace.as_millis() as u64,
            "stopped accepting; waiting for running statements"
        );
        let drained = tokio::time::timeout(self.shared.config.shutdown_grace, async {
            while running.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!(
                connections = running.len(),
                "grace period over; closing the remaining connections"
            );
            running.abort_all();
            while running.join_next().await.is_some() {}
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
        info!("server stopped");
    }
}
