//! A statement's time limits: its deadline (the server's statement timeout, or the
//! client's own shorter `SET statement_timeout`) and its cancel token, applied to the work
//! that produces its response and to every row of the response as it is sent, so a query
//! that is still streaming rows is stopped as one that is still planning is.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use datafusion_postgres::pgwire::api::results::Response;
use datafusion_postgres::pgwire::api::ClientInfo;
use datafusion_postgres::pgwire::error::{PgWireError, PgWireResult};
use datafusion_postgres::pgwire::messages::data::DataRow;
use futures::Stream;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::handlers::error;
use super::vars;
use crate::store::gate;

/// The deadline of a statement that starts now: the server's timeout, or the client's own
/// `SET statement_timeout` when that is shorter (a client may tighten, never loosen it).
pub(super) fn deadline(
    server: Option<Duration>,
    client: &impl ClientInfo,
) -> Option<(Instant, Duration)> {
    let own = client
        .metadata()
        .get(vars::TIMEOUT_KEY)
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis);
    let limit = match (server, own) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    limit.map(|d| (Instant::now() + d, d))
}

pub(super) fn timed_out(limit: Duration) -> PgWireError {
    error(
        "ERROR",
        "57014",
        format!(
            "canceling statement due to statement timeout ({} ms)",
            limit.as_millis()
        ),
    )
}

pub(super) fn cancelled() -> PgWireError {
    error(
        "ERROR",
        "57014",
        "canceling statement due to user request".into(),
    )
}

/// Runs a statement's work inside its deadline and its cancel token. The work runs inside
/// a commit gate (`store::gate`): a timeout or cancel that comes before the statement's
/// store write began to commit stops it (the write rolls back) and answers 57014; one that
/// comes after waits for the statement's own outcome, so a client is never told a write
/// did not happen that did.
///
/// A bound nested inside another of the same statement (around work handed off the
/// workers, whose caller's bound cannot be polled until the hand-off returns) shares the
/// outer one's gate: with a gate each, the outer would find its own still open after the
/// inner had let the write commit, and answer 57014 for a write that happened.
pub(super) async fn bounded<T>(
    deadline: Option<(Instant, Duration)>,
    token: &CancellationToken,
    work: impl Future<Output = PgWireResult<T>>,
) -> PgWireResult<T> {
    let sleep = async {
        match deadline {
            Some((at, _)) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    let gate = gate::current().unwrap_or_default();
    let work = gate::within(gate.clone(), work);
    tokio::pin!(work);
    tokio::select! {
        r = &mut work => r,
        _ = token.cancelled() => if gate.abandon() { Err(cancelled()) } else { work.await },
        _ = sleep => if gate.abandon() {
            Err(timed_out(deadline.map(|d| d.1).unwrap_or_default()))
        } else {
            work.await
        },
    }
}

/// Rows a response may send between two looks at its deadline and cancel token while the
/// query keeps producing without waiting.
const ROWS_BETWEEN_CHECKS: u32 = 256;

/// A response's rows, ended by the statement's deadline or cancel token with 57014.
struct BoundedRows {
    rows: Pin<Box<dyn Stream<Item = PgWireResult<DataRow>> + Send>>,
    sleep: Option<(Pin<Box<Sleep>>, Duration)>,
    cancel: Pin<Box<WaitForCancellationFutureOwned>>,
    /// Rows sent since the deadline and token were last polled.
    unchecked: u32,
    done: bool,
}

impl BoundedRows {
    /// The deadline's or the token's error if either has fired; registers the task's waker
    /// with both otherwise.
    fn stopped(&mut self, cx: &mut Context<'_>) -> Option<PgWireError> {
        self.unchecked = 0;
        if self.cancel.as_mut().poll(cx).is_ready() {
            return Some(cancelled());
        }
        if let Some((sleep, limit)) = &mut self.sleep {
            if sleep.as_mut().poll(cx).is_ready() {
                return Some(timed_out(*limit));
            }
        }
        None
    }
}

impl Stream for BoundedRows {
    type Item = PgWireResult<DataRow>;

    // The token and the deadline are polled when the rows are not ready (so their wakers
    // are registered before the task sleeps) and every `ROWS_BETWEEN_CHECKS` rows, not at
    // every row: each poll of the token takes a lock, 50 of them per page of 50 rows (a
    // `perf` profile of the wire bench).
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if this.unchecked >= ROWS_BETWEEN_CHECKS {
            if let Some(e) = this.stopped(cx) {
                this.done = true;
                return Poll::Ready(Some(Err(e)));
            }
        }
        match this.rows.as_mut().poll_next(cx) {
            Poll::Pending => {
                if let Some(e) = this.stopped(cx) {
                    this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Pending
            }
            Poll::Ready(next) => {
                this.unchecked += 1;
                if matches!(next, Some(Err(_)) | None) {
                    this.done = true;
                }
                Poll::Ready(next)
            }
        }
    }
}

/// Bounds the rows of every query response by the statement's deadline and token.
pub(super) fn bound_rows(
    r: &mut Response,
    deadline: Option<(Instant, Duration)>,
    token: &CancellationToken,
) {
    if let Response::Query(q) = r {
        let rows = std::mem::replace(&mut q.data_rows, Box::pin(futures::stream::empty()));
        q.data_rows = Box::pin(BoundedRows {
            rows,
            sleep: deadline.map(|(at, limit)| (Box::pin(tokio::time::sleep_until(at)), limit)),
            cancel: Box::pin(token.clone().cancelled_owned()),
            // Checked before the first row: a statement cancelled or past its deadline while
            // it was planned sends none.
            unchecked: ROWS_BETWEEN_CHECKS,
            done: false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deadline that passes before the statement's write began to commit answers 57014;
    /// one that passes while it commits waits for the statement and answers its outcome.
    #[tokio::test]
    async fn a_deadline_stops_a_statement_only_before_its_commit() {
        let soon = || {
            Some((
                Instant::now() + Duration::from_millis(20),
                Duration::from_millis(20),
            ))
        };
        let token = CancellationToken::new();
        let before = bounded(soon(), &token, async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok(1)
        })
        .await;
        assert!(before.is_err());
        let during = bounded(soon(), &token, async {
            assert!(gate::current().is_some_and(|g| g.begin_commit()));
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok(2)
        })
        .await;
        assert_eq!(during.unwrap(), 2);
        token.cancel();
        let cancelled = bounded(None, &token, async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok(3)
        })
        .await;
        assert!(cancelled.is_err());
    }

    /// A bound inside another (work handed off the workers keeps its statement's deadline)
    /// shares the statement's gate: a write the inner one let commit is waited for by the
    /// outer one too, not answered 57014.
    #[tokio::test]
    async fn a_nested_bound_shares_its_statement_gate() {
        let token = CancellationToken::new();
        let outer = Some((
            Instant::now() + Duration::from_millis(20),
            Duration::from_millis(20),
        ));
        let r = bounded(outer, &token, async {
            bounded(None, &token, async {
                assert!(gate::current().is_some_and(|g| g.begin_commit()));
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok(4)
            })
            .await
        })
        .await;
        assert_eq!(r.unwrap(), 4);
    }
}
