//! One connection, from the first byte to the close.
//!
//! pgwire's own connection loop (`process_socket`) answers a FATAL error by marking the
//! connection ready for queries, shutting only the write half, and reading on: a client that
//! sends a bad SASL message and then a Query in the same write gets its Query executed, with
//! no login. This module runs the loop instead, around pgwire's per-message dispatch:
//!
//! - **The start** is read here with exact reads (no buffering), so nothing a client sends
//!   after an SSLRequest can be carried into the TLS stream: it is refused if already there,
//!   and otherwise read by the TLS handshake, which fails on it. A CancelRequest is served
//!   before the connection limit is consulted (it needs no slot; the limit is when it is
//!   needed most). Until the login completes, a startup timeout applies, and the connection
//!   counts against the bounds of [`super::handshake`], not against `--max-connections`: it
//!   takes a slot only when its login completes, so silent half-open logins cannot hold
//!   the slots.
//! - **Startup parameters** are checked with the rules of `SET` ([`vars::startup`]) before
//!   the password is asked for, and applied to the session at the login.
//! - **The login marker** is set by the [`Gate`] alone, when the authenticator reports
//!   success; it holds the user's role and the connection's own session. Before it is set,
//!   the loop passes nothing but authentication messages to pgwire, and the query handlers
//!   refuse to run anything without it.
//! - **Errors**: before the login every error is FATAL, and a FATAL error closes the
//!   connection in both directions at once; nothing further is read.
//! - **Frames** reach pgwire only through [`Checked`], which refuses malformed ones before
//!   pgwire's decoders (which can panic on them) see them.
//! - **Panics** while a message is handled become an error of that statement (XX000);
//!   before the login, a FATAL one.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use async_trait::async_trait;
use futures::{FutureExt, Sink, SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::cancels::CancelKey;

use datafusion_postgres::pgwire::api::auth::noop::NoopStartupHandler;
use datafusion_postgres::pgwire::api::auth::sasl::scram::ScramAuth;
use datafusion_postgres::pgwire::api::auth::sasl::SASLAuthStartupHandler;
use datafusion_postgres::pgwire::api::auth::StartupHandler;
use datafusion_postgres::pgwire::api::{
    ClientInfo, DefaultClient, ErrorHandler, NoopHandler, PgWireConnectionState,
    PidSecretKeyGenerator, RandomPidSecretKeyGenerator,
};
use datafusion_postgres::pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use datafusion_postgres::pgwire::messages::response::ErrorResponse;
use datafusion_postgres::pgwire::messages::startup::{
    ParameterStatus, PasswordMessageFamily, Startup,
};
use datafusion_postgres::pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use datafusion_postgres::pgwire::tokio::server::{
    process_error, process_message, PgWireMessageServerCodec,
};

use super::auth::SCRAM_ITERATIONS;
use super::frames::{self, Checked, StartupPacket};
use super::guard::Role;
use super::handlers::{self, DfStatement};
use super::handshake::Handshake;
use super::retained::Retained;
use super::vars::{self, Change};
use super::{ServerError, Shared};

/// Longest a connection may take to send its StartupMessage (TLS negotiation included).
pub(super) const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The connection's byte stream: plain TCP, or TLS over it.
pub(super) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// The framed connection pgwire's handlers work on.
pub(super) type Conn = Framed<Checked<Stream>, PgWireMessageServerCodec<DfStatement>>;

/// An ErrorResponse as raw bytes, for the start, before there is a framed connection.
fn raw_error(severity: &str, code: &str, message: &str) -> Vec<u8> {
    let mut body = Vec::new();
    for (field, value) in [
        (b'S', severity),
        (b'V', severity),
        (b'C', code),
        (b'M', message),
    ] {
        body.push(field);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut msg = vec![b'E'];
    msg.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
    msg.extend_from_slice(&body);
    msg
}

/// Writes a FATAL error and closes (best effort: the client may be gone).
async fn refuse<S: AsyncWrite + Unpin>(stream: &mut S, code: &str, message: &str) {
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        let _ = stream.write_all(&raw_error("FATAL", code, message)).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// Reads one untyped start packet with exact reads.
async fn read_start_packet<S: AsyncRead + Unpin>(
    stream: &mut S,
) -> io::Result<Result<StartupPacket, frames::FrameError>> {
    let mut head = [0u8; 4];
    stream.read_exact(&mut head).await?;
    let len = match frames::startup_length(head) {
        Ok(n) => n,
        Err(e) => return Ok(Err(e)),
    };
    let mut body = vec![0u8; len - 4];
    stream.read_exact(&mut body).await?;
    Ok(frames::startup_packet(&body))
}

/// What the start produced: a connection to serve, or nothing more to do.
enum Started {
    Serve(Stream, Startup),
    Done,
}

/// Negotiates TLS (PostgreSQL's SSLRequest or direct TLS), declines GSS encryption, serves
/// a CancelRequest, and returns the stream with its StartupMessage.
async fn negotiate(tcp: TcpStream, shared: &Shared) -> io::Result<Started> {
    tcp.set_nodelay(true)?;
    let mut first = [0u8; 1];
    let direct = tcp.peek(&mut first).await? == 1 && first[0] == 0x16;
    let mut stream = if direct {
        let Some(acceptor) = &shared.tls else {
            // A TLS ClientHello to a server without TLS: nothing sensible can be said.
            return Ok(Started::Done);
        };
        let tls = acceptor.accept(tcp).await?;
        let alpn_ok = tls.get_ref().1.alpn_protocol() == Some(b"postgresql");
        let mut stream = Stream::Tls(Box::new(tls));
        if !alpn_ok {
            refuse(
                &mut stream,
                "08P01",
                "direct TLS needs the ALPN protocol \"postgresql\"",
            )
            .await;
            return Ok(Started::Done);
        }
        stream
    } else {
        Stream::Plain(tcp)
    };
    let (mut asked_ssl, mut asked_gss) = (false, false);
    loop {
        let packet = match read_start_packet(&mut stream).await? {
            Ok(p) => p,
            Err(e) => {
                refuse(&mut stream, "08P01", &e.to_string()).await;
                return Ok(Started::Done);
            }
        };
        let secure = matches!(stream, Stream::Tls(_));
        match packet {
            StartupPacket::Ssl if !secure && !asked_ssl => {
                asked_ssl = true;
                let Stream::Plain(tcp) = stream else {
                    unreachable!("not secure means plain")
                };
                let Some(acceptor) = &shared.tls else {
                    let mut tcp = tcp;
                    tcp.write_all(b"N").await?;
                    stream = Stream::Plain(tcp);
                    continue;
                };
                // Bytes sent after the SSLRequest, before our answer, were written in the
                // clear: they must not become part of the encrypted session.
                let mut probe = [0u8; 1];
                if let Some(Ok(n)) = tcp.peek(&mut probe).now_or_never() {
                    if n > 0 {
                        let mut tcp = tcp;
                        refuse(
                            &mut tcp,
                            "08P01",
                            "received unencrypted data after SSL request",
                        )
                        .await;
                        return Ok(Started::Done);
                    }
                }
                let mut tcp = tcp;
                tcp.write_all(b"S").await?;
                stream = Stream::Tls(Box::new(acceptor.accept(tcp).await?));
            }
            StartupPacket::GssEnc if !secure && !asked_gss => {
                asked_gss = true;
                stream.write_all(b"N").await?;
            }
            StartupPacket::Ssl | StartupPacket::GssEnc => {
                refuse(&mut stream, "08P01", "repeated or late encryption request").await;
                return Ok(Started::Done);
            }
            StartupPacket::Cancel { pid, key } => {
                shared.cancels.cancel(pid, &key);
                return Ok(Started::Done);
            }
            StartupPacket::Startup {
                major,
                minor,
                params,
            } => {
                let mut startup = Startup::new();
                startup.protocol_number_major = major;
                startup.protocol_number_minor = minor;
                startup.parameters = params.into_iter().collect();
                return Ok(Started::Serve(stream, startup));
            }
        }
    }
}

/// The token of a connection's running statement (replaced at each statement's start).
#[derive(Default)]
pub(super) struct StatementSlot {
    current: Mutex<CancellationToken>,
}

impl StatementSlot {
    /// A fresh token for the statement that starts now.
    pub(super) fn begin(&self) -> CancellationToken {
        let token = CancellationToken::new();
        *self.current.lock().expect("statement slot lock") = token.clone();
        token
    }

    pub(super) fn cancel(&self) {
        self.current.lock().expect("statement slot lock").cancel();
    }
}

/// Who logged in, and the session their statements run in.
pub(super) struct Login {
    /// The user's role.
    pub(super) role: Role,
    /// The connection's own session and its pgwire glue.
    pub(super) session: handlers::ConnSession,
}

/// A connection's state shared by its handlers.
pub(super) struct ConnState {
    pub(super) shared: Arc<Shared>,
    /// Set once, by the [`Gate`], when the authenticator reports success.
    login: OnceLock<Login>,
    /// Mirrors `login` for the frame checker (which lifts its pre-login size limit).
    logged_in: Arc<AtomicBool>,
    pub(super) statement: Arc<StatementSlot>,
    cancel_key: Mutex<Option<CancelKey>>,
    /// The connection's place among those not yet logged in; released at the login.
    start: Mutex<Option<Handshake>>,
    /// Its `--max-connections` slot, taken at the login.
    slot: Mutex<Option<OwnedSemaphorePermit>>,
}

impl ConnState {
    /// The login, or the refusal of anything a connection without one asks for.
    pub(super) fn login(&self) -> PgWireResult<&Login> {
        self.login.get().ok_or_else(|| {
            PgWireError::UserError(Box::new(ErrorInfo::new(
                "FATAL".into(),
                "08P01".into(),
                "no statement runs before authentication has completed".into(),
            )))
        })
    }

    fn logged_in(&self) -> bool {
        self.login.get().is_some()
    }
}

impl Drop for ConnState {
    fn drop(&mut self) {
        if let Some((pid, key)) = self.cancel_key.lock().expect("cancel key lock").take() {
            self.shared.cancels.unregister(pid, &key);
        }
    }
}

/// Startup without passwords (only on loopback, with `--insecure-no-auth`).
struct Open {
    pids: Arc<RandomPidSecretKeyGenerator>,
}

#[async_trait]
impl NoopStartupHandler for Open {
    fn pid_secret_key_generator(&self) -> &dyn PidSecretKeyGenerator {
        &*self.pids
    }

    /// Reports the values the client set at its start (pgwire's own report has only the
    /// defaults on this path).
    async fn post_startup<C>(
        &self,
        client: &mut C,
        _message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: std::fmt::Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        for (name, value) in vars::Reported::overrides(client.metadata()) {
            client
                .feed(PgWireBackendMessage::ParameterStatus(ParameterStatus::new(
                    name, value,
                )))
                .await?;
        }
        Ok(())
    }
}

/// The startup handler: refuses plaintext when TLS is required, checks the shape of SASL
/// messages pgwire would otherwise decode unchecked, runs SCRAM (or nothing), and on
/// success sets the login marker.
pub(super) struct Gate {
    conn: Arc<ConnState>,
    scram: Option<SASLAuthStartupHandler<vars::Reported>>,
    open: Open,
    sasl_started: AtomicBool,
    /// What the StartupMessage's parameters change, applied to the session at the login.
    settings: Mutex<Option<Change>>,
}

impl Gate {
    fn new(conn: Arc<ConnState>) -> Self {
        let scram = conn.shared.users.as_ref().map(|users| {
            let mut scram = ScramAuth::new(users.clone());
            scram.set_iterations(SCRAM_ITERATIONS);
            SASLAuthStartupHandler::new(Arc::new(vars::Reported::default()))
                .with_scram(scram)
                .with_pid_secret_key_generator(conn.shared.pids.clone())
        });
        Self {
            open: Open {
                pids: conn.shared.pids.clone(),
            },
            conn,
            scram,
            sasl_started: false.into(),
            settings: Mutex::new(None),
        }
    }

    fn fatal(code: &str, message: &str) -> PgWireError {
        PgWireError::UserError(Box::new(ErrorInfo::new(
            "FATAL".into(),
            code.into(),
            message.into(),
        )))
    }

    /// Takes a connection slot before the message that may complete the login is handled
    /// (so that the login, once reported to the client, holds one), or refuses with 53300.
    /// A failed proof closes the connection and frees the slot at once.
    fn take_slot<C: ClientInfo>(&self, client: &C) -> PgWireResult<()> {
        let mut slot = self.conn.slot.lock().expect("slot lock");
        if slot.is_some() {
            return Ok(());
        }
        let Ok(permit) = self.conn.shared.slots.clone().try_acquire_owned() else {
            warn!(
                peer = %client.socket_addr(),
                limit = self.conn.shared.config.max_connections,
                "connection refused: limit reached"
            );
            return Err(Self::fatal("53300", "sorry, too many clients already"));
        };
        *slot = Some(permit);
        Ok(())
    }

    /// Applies the startup settings and sets the login marker after the authenticator
    /// reported success.
    fn log_in<C: ClientInfo>(&self, client: &mut C) -> PgWireResult<()> {
        self.take_slot(&*client)?;
        // Logged in: no longer counted among the starts.
        drop(self.conn.start.lock().expect("start lock").take());
        let user = client.metadata().get("user").cloned().unwrap_or_default();
        let role = match &self.conn.shared.users {
            Some(users) => users
                .role(&user)
                .ok_or_else(|| Self::fatal("28P01", "authentication failed"))?,
            // No authentication configured: the loopback-only developer mode.
            None => Role::Admin,
        };
        let session = handlers::ConnSession::new(&self.conn.shared, role)
            .map_err(|e| Self::fatal("53000", &format!("cannot start a session: {e}")))?;
        if let Some(change) = self.settings.lock().expect("settings lock").take() {
            vars::apply(&change, client.metadata_mut(), &session.ctx);
        }
        let (pid, key) = client.pid_and_secret_key();
        let key = key.to_bytes().to_vec();
        self.conn
            .shared
            .cancels
            .register(pid, key.clone(), self.conn.statement.clone());
        *self.conn.cancel_key.lock().expect("cancel key lock") = Some((pid, key));
        if self.conn.login.set(Login { role, session }).is_err() {
            return Err(Self::fatal("08P01", "authentication completed twice"));
        }
        self.conn.logged_in.store(true, Ordering::Release);
        debug!(user, role = role.name(), "logged in");
        Ok(())
    }
}

#[async_trait]
impl StartupHandler for Gate {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: std::fmt::Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if self.conn.logged_in() {
            return Err(Self::fatal("08P01", "authentication message after login"));
        }
        let mut message = message;
        match &mut message {
            PgWireFrontendMessage::Startup(startup) => {
                if self.conn.shared.tls.is_some() && !client.is_secure() {
                    return Err(Self::fatal(
                        "28000",
                        "this server requires TLS: connect with sslmode=require",
                    ));
                }
                let (kept, change) = vars::startup(
                    startup
                        .parameters
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str())),
                )?;
                // pgwire copies these into the connection's metadata: only the checked
                // values, under the names the formatters and SHOW read.
                startup.parameters = kept.into_iter().collect();
                *self.settings.lock().expect("settings lock") = Some(change);
                if self.scram.is_none() {
                    // Without passwords the StartupMessage completes the login.
                    self.take_slot(&*client)?;
                }
            }
            PgWireFrontendMessage::PasswordMessageFamily(PasswordMessageFamily::Raw(body)) => {
                if self.scram.is_none() {
                    return Err(Self::fatal("08P01", "no password was asked for"));
                }
                if !self.sasl_started.swap(true, Ordering::SeqCst) {
                    frames::sasl_initial_response(body)
                        .map_err(|e| Self::fatal("08P01", &e.to_string()))?;
                } else {
                    // The proof: success completes the login.
                    self.take_slot(&*client)?;
                }
            }
            _ => return Err(Self::fatal("08P01", "expected an authentication message")),
        }
        match &self.scram {
            Some(scram) => scram
                .on_startup(client, message)
                .await
                .map_err(|e| match e {
                    // pgwire echoes the client's SCRAM message; it may carry a proof.
                    PgWireError::InvalidScramMessage(_) => {
                        Self::fatal("08P01", "invalid SCRAM-SHA-256 message")
                    }
                    other => other,
                })?,
            None => self.open.on_startup(client, message).await?,
        }
        if matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
            self.log_in(client)?;
        }
        Ok(())
    }
}

/// Accepts one TCP connection: the start, a slot, the login, then statements until the
/// client leaves or breaks the protocol.
pub(super) async fn serve(
    tcp: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    handshake: Handshake,
) {
    let deadline = Instant::now() + shared.config.startup_timeout;
    // The start (TLS, the StartupMessage) is quick for any real client; a socket that stays
    // silent is dropped well before the login's own timeout.
    let start_deadline = deadline.min(Instant::now() + HANDSHAKE_TIMEOUT);
    let (mut stream, startup) =
        match tokio::time::timeout_at(start_deadline, negotiate(tcp, &shared)).await {
            Ok(Ok(Started::Serve(stream, startup))) => (stream, startup),
            Ok(Ok(Started::Done)) => return,
            Ok(Err(e)) => {
                debug!(%peer, error = %e, "connection ended during its start");
                return;
            }
            Err(_) => {
                debug!(%peer, "start timed out");
                return;
            }
        };
    // Full already: refused before the password is asked for. The slot itself is taken
    // at the login (see `Gate::take_slot`), the start bounds apply until then.
    if shared.slots.available_permits() == 0 {
        warn!(%peer, limit = shared.config.max_connections, "connection refused: limit reached");
        refuse(&mut stream, "53300", "sorry, too many clients already").await;
        return;
    }
    let secure = matches!(stream, Stream::Tls(_));
    let client: DefaultClient<DfStatement> = DefaultClient::new(peer, secure);
    let logged_in = Arc::new(AtomicBool::new(false));
    let mut socket = Framed::new(
        Checked::new(stream, shared.config.max_message_bytes, logged_in.clone()),
        PgWireMessageServerCodec::new(client),
    );
    socket.set_state(PgWireConnectionState::AwaitingStartup);
    if let Err(e) = run(&mut socket, startup, shared, deadline, logged_in, handshake).await {
        debug!(%peer, error = %e, "connection ended with an error");
    }
    // Dropping the socket closes both directions.
}

/// Whether a message may be handled now: only authentication before the login, and no
/// authentication after it.
fn admissible(message: &PgWireFrontendMessage, logged_in: bool) -> bool {
    let auth = matches!(message, PgWireFrontendMessage::PasswordMessageFamily(_));
    if logged_in {
        !auth
            && !matches!(
                message,
                PgWireFrontendMessage::Startup(_)
                    | PgWireFrontendMessage::CancelRequest(_)
                    | PgWireFrontendMessage::SslNegotiation(_)
            )
    } else {
        auth
    }
}

/// Sends a FATAL error and flushes; the caller then drops the connection. Logged at info:
/// who (address, user name) and why, never what they sent.
async fn fatal(socket: &mut Conn, mut info: ErrorInfo) {
    info.severity = "FATAL".into();
    let user = socket.metadata().get("user").cloned().unwrap_or_default();
    let peer = socket.socket_addr();
    let during = if matches!(
        socket.state(),
        PgWireConnectionState::AwaitingStartup | PgWireConnectionState::AuthenticationInProgress
    ) {
        "login failed"
    } else {
        "connection closed"
    };
    info!(%peer, user, code = info.code, reason = info.message, "{during}");
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        let _ = socket
            .send(PgWireBackendMessage::ErrorResponse(ErrorResponse::from(
                info,
            )))
            .await;
        let _ = socket.close().await;
    })
    .await;
}

/// The message loop.
async fn run(
    socket: &mut Conn,
    startup: Startup,
    shared: Arc<Shared>,
    deadline: Instant,
    logged_in: Arc<AtomicBool>,
    handshake: Handshake,
) -> Result<(), ServerError> {
    let conn = Arc::new(ConnState {
        shared: shared.clone(),
        login: OnceLock::new(),
        logged_in,
        statement: Arc::new(StatementSlot::default()),
        cancel_key: Mutex::new(None),
        start: Mutex::new(Some(handshake)),
        slot: Mutex::new(None),
    });
    let gate = Arc::new(Gate::new(conn.clone()));
    let simple = Arc::new(handlers::Simple::new(conn.clone()));
    let extended = Arc::new(handlers::Extended::new(conn.clone()));
    let copy = Arc::new(NoopHandler);
    let cancel = Arc::new(NoopHandler);
    let errors = handlers::SqlStates;
    let mut retained = Retained::new(shared.config.max_message_bytes);
    let mut first = Some(PgWireFrontendMessage::Startup(startup));
    loop {
        let message = match first.take() {
            // The StartupMessage, read during the start.
            Some(m) => m,
            None => {
                let next = if conn.logged_in() {
                    socket.next().await
                } else {
                    match tokio::time::timeout_at(deadline, socket.next()).await {
                        Ok(m) => m,
                        Err(_) => {
                            let text = "canceling authentication due to timeout";
                            fatal(
                                socket,
                                ErrorInfo::new("FATAL".into(), "08P01".into(), text.into()),
                            )
                            .await;
                            return Ok(());
                        }
                    }
                };
                let message = match next {
                    Some(Ok(m)) => m,
                    Some(Err(e)) => {
                        fatal(socket, protocol_error(e)).await;
                        return Ok(());
                    }
                    None => return Ok(()),
                };
                if matches!(message, PgWireFrontendMessage::Terminate(_)) {
                    return Ok(());
                }
                let logged_in = conn.logged_in();
                if !admissible(&message, logged_in) {
                    let text = if logged_in {
                        "unexpected authentication or startup message"
                    } else {
                        "expected an authentication message; nothing runs before the login"
                    };
                    fatal(
                        socket,
                        ErrorInfo::new("FATAL".into(), "08P01".into(), text.into()),
                    )
                    .await;
                    return Ok(());
                }
                message
            }
        };
        let extended_query = match socket.state() {
            PgWireConnectionState::CopyInProgress(e) => e,
            _ => message.is_extended_query(),
        };
        // What the message keeps (statements, portals), checked against the limits before
        // pgwire keeps it; nothing while pgwire discards messages until a Sync.
        let effect = match socket.state() {
            PgWireConnectionState::ReadyForQuery | PgWireConnectionState::QueryInProgress => {
                retained.check(&message)
            }
            PgWireConnectionState::AwaitingSync
                if matches!(message, PgWireFrontendMessage::Sync(_)) =>
            {
                retained.check(&message)
            }
            _ => Ok(None),
        };
        let effect = match effect {
            Ok(effect) => effect,
            Err(info) => {
                process_error(socket, PgWireError::UserError(Box::new(info)), true)
                    .await
                    .map_err(|e| ServerError::Io(e.to_string()))?;
                continue;
            }
        };
        // A panic while a message is handled (DataFusion has panicked under memory pressure
        // in a repartition, a user-defined function may) fails that statement alone: the
        // client is told, and the connection, its slot and its session carry on. Without
        // this the task unwound and the client saw its connection drop with no answer.
        let result = std::panic::AssertUnwindSafe(process_message(
            message,
            socket,
            gate.clone(),
            simple.clone(),
            extended.clone(),
            copy.clone(),
            cancel.clone(),
        ))
        .catch_unwind()
        .await
        .unwrap_or_else(|_| Err(handlers::internal_error()));
        if let (Ok(()), Some(effect)) = (&result, effect) {
            retained.apply(effect);
        }
        if let Err(mut e) = result {
            errors.on_error(&*socket, &mut e);
            let info = ErrorInfo::from(e);
            if info.is_fatal() || !conn.logged_in() {
                fatal(socket, info).await;
                return Ok(());
            }
            process_error(
                socket,
                PgWireError::UserError(Box::new(info)),
                extended_query,
            )
            .await
            .map_err(|e| ServerError::Io(e.to_string()))?;
        }
    }
}

/// The FATAL answer to a stream error: a refused frame says what was wrong with it.
fn protocol_error(e: PgWireError) -> ErrorInfo {
    let message = match &e {
        PgWireError::IoError(io) => match frames::frame_error(io) {
            Some(f) => f.to_string(),
            None => format!("connection error: {io}"),
        },
        other => format!("invalid frontend message: {other}"),
    };
    ErrorInfo::new("FATAL".into(), "08P01".into(), message)
}
