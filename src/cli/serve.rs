//! `pulpitum serve`: its flags and the start of the wire server from them.
//!
//! The flags become a [`crate::server::ServerConfig`] here (users from a file or one from
//! the environment, each with a role; TLS; connection, memory, message and time limits),
//! the session is the shell's over the same URLs, recorded as a reader of the store, and
//! the server runs until SIGTERM or SIGINT, then gives running statements the grace period
//! and removes its reader record. The password of `--user` is read from the environment
//! only: a flag would show in `ps`.

/// `pulpitum serve`'s flags.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (HOST:PORT).
    #[arg(long, env = "PULPITUM_SERVER_LISTEN", default_value = crate::server::DEFAULT_LISTEN)]
    pub listen: String,
    /// File of users allowed to connect, one name:password:role per line (role: read, write
    /// or admin; owned by the server's user, mode 0600).
    #[arg(long, env = "PULPITUM_SERVER_USERS_FILE")]
    pub users_file: Option<std::path::PathBuf>,
    /// One user allowed to connect (with PULPITUM_SERVER_PASSWORD and --role).
    #[arg(long, env = "PULPITUM_SERVER_USER")]
    pub user: Option<String>,
    /// The --user's role: read (queries), write (and INSERT) or admin (and control
    /// statements).
    #[arg(long, env = "PULPITUM_SERVER_ROLE")]
    pub role: Option<String>,
    /// Accept connections without a password; refused unless the address is loopback.
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// PEM certificate chain; with --tls-key, every client must use TLS.
    #[arg(long, env = "PULPITUM_SERVER_TLS_CERT")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of the certificate.
    #[arg(long, env = "PULPITUM_SERVER_TLS_KEY")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Connections served at once; more are refused with SQLSTATE 53300.
    #[arg(long, env = "PULPITUM_SERVER_MAX_CONNECTIONS", default_value = "100")]
    pub max_connections: usize,
    /// Seconds a connection may take from its first byte to a completed login.
    #[arg(
        long,
        env = "PULPITUM_SERVER_STARTUP_TIMEOUT_SECONDS",
        default_value = "30"
    )]
    pub startup_timeout_seconds: u64,
    /// Memory all queries together may hold (e.g. 8GiB); default: half the machine's memory.
    #[arg(long, env = "PULPITUM_SERVER_MEMORY_LIMIT")]
    pub memory_limit: Option<String>,
    /// Memory one query may hold (e.g. 2GiB); default: a quarter of --memory-limit. Past
    /// it, SQLSTATE 53200.
    #[arg(long, env = "PULPITUM_SERVER_QUERY_MEMORY_LIMIT")]
    pub query_memory_limit: Option<String>,
    /// Longest Query, Parse, Bind or CopyData message a client may send (e.g. 64MiB).
    #[arg(
        long,
        env = "PULPITUM_SERVER_MAX_MESSAGE_BYTES",
        default_value = "64MiB"
    )]
    pub max_message_bytes: String,
    /// Longest a statement may run, in milliseconds (0: no limit); past it, SQLSTATE 57014.
    #[arg(
        long,
        env = "PULPITUM_SERVER_STATEMENT_TIMEOUT_MS",
        default_value = "300000"
    )]
    pub statement_timeout_ms: u64,
    /// Seconds running statements get to finish after SIGTERM before connections are closed.
    #[arg(
        long,
        env = "PULPITUM_SERVER_SHUTDOWN_GRACE_SECONDS",
        default_value = "10"
    )]
    pub shutdown_grace_seconds: u64,
}

/// Serves the tables the URLs name over the PostgreSQL wire protocol until SIGTERM or
/// SIGINT, with the shell's session options (`opts`), recorded as the reader `serve`.
pub async fn run(
    args: &ServeArgs,
    database_url: &str,
    archive_url: &str,
    opts: crate::session::SessionOptions,
    workers: Option<&crate::distributed::DistributedSettings>,
) -> Result<(), String> {
    use crate::server::memory::{default_server_limit, parse_size};
    use crate::server::{Role, Server, ServerConfig, Users};
    let mut users: Option<Users> = None;
    if let Some(path) = &args.users_file {
        users = Some(Users::from_file(path).map_err(|e| e.to_string())?);
    }
    if let Some(name) = &args.user {
        // The password only from the environment: a flag would show in `ps`.
        let password = std::env::var("PULPITUM_SERVER_PASSWORD").map_err(|_| {
            "--user (PULPITUM_SERVER_USER) needs PULPITUM_SERVER_PASSWORD in the environment"
                .to_string()
        })?;
        let role = match args.role.as_deref() {
            Some(r) => Role::parse(r).ok_or_else(|| {
                format!("--role (PULPITUM_SERVER_ROLE) {r:?}: the roles are read, write and admin")
            })?,
            None => {
                return Err(
                    "--user (PULPITUM_SERVER_USER) needs a role: add --role read, write \
                            or admin (or PULPITUM_SERVER_ROLE)"
                        .into(),
                )
            }
        };
        let set = users.get_or_insert_with(Users::default);
        set.add(name, &password, role, "PULPITUM_SERVER_USER")
            .map_err(|e| e.to_string())?;
    } else if args.role.is_some() {
        return Err(
            "--role (PULPITUM_SERVER_ROLE) is the role of --user; give --user too \
                    (a users file names each user's role on its line)"
                .into(),
        );
    }
    let size = |flag: &str, text: &str| parse_size(text).map_err(|e| format!("{flag}: {e}"));
    let memory_limit = match &args.memory_limit {
        Some(t) => size("--memory-limit", t)?,
        None => default_server_limit(),
    };
    let query_memory_limit = match &args.query_memory_limit {
        Some(t) => size("--query-memory-limit", t)?,
        None => memory_limit / 4,
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => Some((c.clone(), k.clone())),
        (None, None) => None,
        _ => return Err("--tls-cert and --tls-key go together".into()),
    };
    let config = ServerConfig {
        listen: args.listen.clone(),
        users,
        insecure_no_auth: args.insecure_no_auth,
        tls,
        max_connections: args.max_connections,
        startup_timeout: std::time::Duration::from_secs(args.startup_timeout_seconds.max(1)),
        memory_limit,
        query_memory_limit,
        max_message_bytes: size("--max-message-bytes", &args.max_message_bytes)?,
        statement_timeout: (args.statement_timeout_ms > 0)
            .then(|| std::time::Duration::from_millis(args.statement_timeout_ms)),
        shutdown_grace: std::time::Duration::from_secs(args.shutdown_grace_seconds),
        // The binary's runtime (built by `server::runtime_builder`, with the connections'
        // stacks) drives the hot store's connections too: on it, a statement's request to
        // PostgreSQL and its answer do not cross between runtimes (about 0.25x of a direct
        // page, docs/benchmarks.md). Statements that plan slowly do not stall it: planning
        // runs off its workers (`server::offload`).
        runtime: crate::server::ConnectionRuntime::Caller,
    };
    let opts = crate::session::SessionOptions {
        reader: Some("serve"),
        ..opts
    };
    let ctx = crate::session::connect_with_workers(database_url, archive_url, opts, workers)
        .await
        .map_err(|e| e.to_string())?;
    let server = Server::bind(ctx.clone(), config)
        .await
        .map_err(|e| e.to_string())?;
    let addr = server.local_addr().map_err(|e| e.to_string())?;
    eprintln!("pulpitum: serving PostgreSQL clients on {addr}");
    let shutdown = tokio_util::sync::CancellationToken::new();
    {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            wait_for_stop_signal().await;
            eprintln!("pulpitum: stopping (running statements get the grace period)");
            shutdown.cancel();
        });
    }
    server.run(shutdown).await;
    crate::control::readers::release(&ctx).await;
    Ok(())
}

/// Returns at SIGTERM or SIGINT (Ctrl-C).
pub async fn wait_for_stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
