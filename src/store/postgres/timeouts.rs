//! Timeouts of the PostgreSQL/CockroachDB connections, so that no call waits forever on a
//! server or a network that stopped answering.
//!
//! Each setting is a default applied only when the connection string does not set it
//! already, so an operator tunes them where PostgreSQL users expect to: `connect_timeout`,
//! `tcp_user_timeout` and `keepalives_idle` as URL parameters, the session settings as
//! `options=-c statement_timeout=...`. The server-side timeouts end work a client has
//! abandoned (a statement whose caller hit its deadline, a transaction whose `COMMIT` never
//! arrived and whose row locks would otherwise fence out the next worker); the socket-level
//! ones close a connection whose peer vanished, so the pool replaces it. A client-side
//! deadline (the archiver's operation deadline, the pool's creation timeout) is still
//! needed where the server cannot answer at all.

use std::time::Duration;

/// TCP connect timeout, per address.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Server-side limit of one statement (`statement_timeout`).
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(60);
/// Server-side limit of a transaction waiting for its client
/// (`idle_in_transaction_session_timeout`); the session is closed and its locks released.
pub const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);
/// How long sent data may stay unacknowledged before the socket is closed (Linux).
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle time before TCP keepalive probes start (the library default is two hours).
pub const KEEPALIVES_IDLE: Duration = Duration::from_secs(30);
/// Interval between keepalive probes, and how many unanswered probes close the socket.
pub const KEEPALIVES_INTERVAL: Duration = Duration::from_secs(10);
/// See [`KEEPALIVES_INTERVAL`].
pub const KEEPALIVES_RETRIES: u32 = 3;
/// Extra time, beyond the connect timeout, for the startup handshake of a new pooled
/// connection (authentication and session parameters).
pub const STARTUP_ALLOWANCE: Duration = Duration::from_secs(10);

/// tokio-postgres's own keepalive idle default, which means "not set by the URL".
const LIBRARY_KEEPALIVES_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// Applies the socket defaults to `pg`, leaving every value the URL set alone. Returns the
/// pool's creation timeout: the connect timeout plus the startup allowance.
pub(crate) fn apply_socket(pg: &mut tokio_postgres::Config) -> Duration {
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(CONNECT_TIMEOUT);
    }
    if pg.get_tcp_user_timeout().is_none() {
        pg.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
    if pg.get_keepalives_idle() == LIBRARY_KEEPALIVES_IDLE {
        pg.keepalives_idle(KEEPALIVES_IDLE);
    }
    if pg.get_keepalives_interval().is_none() {
        pg.keepalives_interval(KEEPALIVES_INTERVAL);
    }
    if pg.get_keepalives_retries().is_none() {
        pg.keepalives_retries(KEEPALIVES_RETRIES);
    }
    pg.get_connect_timeout()
        .copied()
        .unwrap_or(CONNECT_TIMEOUT)
        .saturating_add(STARTUP_ALLOWANCE)
}

/// Appends the session defaults to `options` (the `-c name=value` list sent at startup)
/// unless it sets them already.
pub(crate) fn apply_session(options: &mut String) {
    for (name, value) in [
        ("statement_timeout", STATEMENT_TIMEOUT),
        (
            "idle_in_transaction_session_timeout",
            IDLE_IN_TRANSACTION_TIMEOUT,
        ),
    ] {
        if !mentions(options, name) {
            // Milliseconds without a unit: read the same way by PostgreSQL and CockroachDB.
            options.push_str(&format!(" -c {name}={}", value.as_millis()));
        }
    }
}

/// Whether `options` sets `name` (`-c name=`, `-cname=` or `--name=`), as a whole word:
/// `statement_timeout` is not `idle_session_statement_timeout`.
fn mentions(options: &str, name: &str) -> bool {
    options.match_indices(name).any(|(at, _)| {
        let before = options[..at].chars().next_back();
        let after = options[at + name.len()..].chars().next();
        matches!(before, None | Some(' ' | 'c' | '-')) && after == Some('=')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(url: &str) -> (tokio_postgres::Config, String, Duration) {
        let mut pg: tokio_postgres::Config = url.parse().unwrap();
        let mut options = pg.get_options().unwrap_or_default().to_string();
        let create = apply_socket(&mut pg);
        apply_session(&mut options);
        (pg, options, create)
    }

    #[test]
    fn defaults_fill_what_the_url_leaves_unset() {
        let (pg, options, create) = applied("postgres://u@h/db");
        assert_eq!(pg.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
        assert_eq!(pg.get_tcp_user_timeout(), Some(&TCP_USER_TIMEOUT));
        assert_eq!(pg.get_keepalives_idle(), KEEPALIVES_IDLE);
        assert_eq!(pg.get_keepalives_interval(), Some(KEEPALIVES_INTERVAL));
        assert_eq!(pg.get_keepalives_retries(), Some(KEEPALIVES_RETRIES));
        assert!(options.contains("-c statement_timeout=60000"), "{options}");
        assert!(
            options.contains("-c idle_in_transaction_session_timeout=60000"),
            "{options}"
        );
        assert_eq!(create, CONNECT_TIMEOUT + STARTUP_ALLOWANCE);
    }

    #[test]
    fn the_url_wins() {
        let (pg, options, create) = applied(
            "postgres://u@h/db?connect_timeout=3&tcp_user_timeout=7&keepalives_idle=9\
             &options=-c%20statement_timeout%3D5000%20-c%20idle_in_transaction_session_timeout%3D0",
        );
        assert_eq!(pg.get_connect_timeout(), Some(&Duration::from_secs(3)));
        assert_eq!(pg.get_tcp_user_timeout(), Some(&Duration::from_secs(7)));
        assert_eq!(pg.get_keepalives_idle(), Duration::from_secs(9));
        assert_eq!(
            options,
            "-c statement_timeout=5000 -c idle_in_transaction_session_timeout=0"
        );
        assert_eq!(create, Duration::from_secs(3) + STARTUP_ALLOWANCE);
    }

    #[test]
    fn only_whole_setting_names_count() {
        assert!(mentions("-c statement_timeout=1", "statement_timeout"));
        assert!(mentions("-cstatement_timeout=1", "statement_timeout"));
        assert!(mentions("--statement_timeout=1", "statement_timeout"));
        assert!(!mentions("-c x_statement_timeout=1", "statement_timeout"));
        assert!(!mentions("-c statement_timeouts=1", "statement_timeout"));
    }
}
