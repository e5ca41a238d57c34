//! `pulpitum serve`: the PostgreSQL wire protocol over the same session the shell uses, so
//! psql, drivers and BI tools query Pulpitum tables (and the control plane's system tables)
//! as they would a PostgreSQL database.
//!
//! The protocol is pgwire's and the DataFusion glue datafusion-postgres's; this module keeps
//! their unsafe defaults out:
//!
//! - **Authentication**: SCRAM-SHA-256 against configured users ([`auth`]). Without users the
//!   server refuses to start, unless `--insecure-no-auth` is given and the address is
//!   loopback.
//! - **TLS** ([`tls`]): from PEM files; a configuration that cannot be loaded stops the start
//!   (never a silent plaintext fallback), and with TLS configured a plaintext client is
//!   refused.
//! - **Limits**: a connection limit (the client over it gets SQLSTATE 53300, as PostgreSQL
//!   answers "too many clients"), a per-statement timeout (57014), and the client's cancel
//!   request, both stopping the statement's execution, not only its planning.
//! - **What runs**: queries, INSERT, EXPLAIN, SET/SHOW, transactions and the control
//!   statements; DDL and file access are refused (42501) so a remote client cannot make the
//!   server read or write local files.
//! - **Shutdown**: on the token (SIGTERM in the binary), the listener closes at once and
//!   connections get a grace period to finish their statements; what remains is closed.

pub mod auth;
mod handlers;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use datafusion::prelude::SessionContext;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use datafusion_postgres::datafusion_pg_catalog::setup_pg_catalog;
use datafusion_postgres::hooks::cursor::CursorStatementHook;
use datafusion_postgres::hooks::set_show::SetShowHook;
use datafusion_postgres::hooks::transactions::TransactionStatementHook;
use datafusion_postgres::pgwire::api::ConnectionManager;
use datafusion_postgres::pgwire::tokio::process_socket;
use datafusion_postgres::{DfSessionService, QueryHook};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use auth::Users;

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
    /// Longest a statement may run (planning, execution and collecting its rows); `None`:
    /// no limit.
    pub statement_timeout: Option<Duration>,
    /// How long running statements may take to finish after shutdown begins.
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.into(),
            users: None,
            insecure_no_auth: false,
            tls: None,
            max_connections: 100,
            statement_timeout: Some(Duration::from_secs(300)),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// A bound server, ready to run.
pub struct Server {
    listener: TcpListener,
    factory: Arc<handlers::Factory>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    slots: Arc<Semaphore>,
    config: ServerConfig,
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
                    "no user is configured: give --users-file, or PULPITUM_SERVER_USER and \
                     PULPITUM_SERVER_PASSWORD (or --insecure-no-auth on a loopback address)"
                        .into(),
                ))
            }
        };
        setup_pg_catalog(&ctx, "datafusion", EmptyContextProvider)
            .map_err(|e| ServerError::Catalog(e.to_string()))?;
        let ctx = Arc::new(ctx);
        // Ours around datafusion-postgres's: control statements parse, SET/SHOW, transactions
        // and cursors are answered, and whatever is left must be a query, INSERT or EXPLAIN.
        let hooks: Vec<Arc<dyn QueryHook>> = vec![
            Arc::new(handlers::ControlParse),
            Arc::new(handlers::Refuse(handlers::shared_setting)),
            Arc::new(CursorStatementHook),
            Arc::new(SetShowHook),
            Arc::new(TransactionStatementHook),
            Arc::new(handlers::Refuse(handlers::refusal)),
        ];
        let inner = Arc::new(DfSessionService::new_with_hooks(ctx.clone(), hooks));
        let factory = Arc::new(handlers::Factory {
            simple: Arc::new(handlers::Simple {
                inner: inner.clone(),
                ctx: ctx.clone(),
                timeout: config.statement_timeout,
            }),
            inner,
            ctx,
            timeout: config.statement_timeout,
            users,
            tls_required: tls.is_some(),
            conns: Arc::new(ConnectionManager::new()),
        });
        Ok(Self {
            listener,
            factory,
            tls,
            slots: Arc::new(Semaphore::new(config.max_connections)),
            config,
        })
    }

    /// The address actually bound (port 0 picks a free one).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` fires, then stops accepting and gives running connections
    /// the grace period before closing them.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut running = JoinSet::new();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(_) = running.join_next(), if !running.is_empty() => {}
                accepted = self.listener.accept() => {
                    let (socket, peer) = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            warn!(error = %e, "accept failed");
                            continue;
                        }
                    };
                    let Ok(slot) = self.slots.clone().try_acquire_owned() else {
                        warn!(%peer, limit = self.config.max_connections, "connection refused: limit reached");
                        running.spawn(refuse_over_limit(socket));
                        continue;
                    };
                    let factory = self.factory.clone();
                    let tls = self.tls.clone();
                    running.spawn(async move {
                        let _slot = slot;
                        if let Err(e) = process_socket(socket, tls, factory).await {
                            tracing::debug!(%peer, error = %e, "connection ended with an error");
                        }
                    });
                }
            }
        }
        drop(self.listener);
        info!(
            connections = running.len(),
            grace_ms = self.config.shutdown_grace.as_millis() as u64,
            "stopped accepting; waiting for running statements"
        );
        let drained = tokio::time::timeout(self.config.shutdown_grace, async {
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
        info!("server stopped");
    }
}

/// Answers a connection over the limit the way PostgreSQL does: an ErrorResponse with
/// SQLSTATE 53300, then close. Sent before reading the startup packet, which libpq and
/// the drivers read as the answer to it.
async fn refuse_over_limit(mut socket: TcpStream) {
    let mut body = Vec::new();
    for (field, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', "53300"),
        (b'M', "sorry, too many clients already"),
    ] {
        body.push(field);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut msg = vec![b'E'];
    msg.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
    msg.extend_from_slice(&body);
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let _ = socket.write_all(&msg).await;
        let _ = socket.shutdown().await;
    })
    .await;
}
