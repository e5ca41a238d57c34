//! SQLSTATEs: what each error a statement can raise is called on the wire.
//!
//! DataFusion, the control plane and the store raise errors of their own types; a client
//! acts on the SQLSTATE (a driver retries 40001, a pool drops a connection on 08xxx), so
//! each is given PostgreSQL's code where one fits ([`SqlStates`], pgwire's error hook),
//! by type where the type survives and by our own stable messages where a transparent
//! wrapper dropped it. A panic caught anywhere in a statement answers [`internal_error`]
//! and leaves its message to the server's log, since it may quote other rows' values.

use datafusion::error::DataFusionError;
use datafusion_postgres::pgwire::api::{ClientInfo, ErrorHandler};
use datafusion_postgres::pgwire::error::{ErrorInfo, PgWireError};

use super::handlers::error;

/// The answer to a panic caught while a statement was decoded, planned or run. The panic's
/// own message goes to the server's log (the panic hook), not to the client: it may quote
/// values of other rows.
pub(super) fn internal_error() -> PgWireError {
    error(
        "ERROR",
        "XX000",
        "internal error while decoding, planning or running the statement (the server logged \
         it); the connection is intact"
            .into(),
    )
}

pub(super) fn api(e: impl std::error::Error + Send + Sync + 'static) -> PgWireError {
    PgWireError::ApiError(Box::new(e))
}

/// What tokio writes of a panicked task's `JoinError` (DataFusion quotes it in its own).
const PANIC_TEXT: &str = " panicked with message ";

/// Whether `e` reports a panic of a spawned task, by type where it is kept, else by text.
fn is_panic(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err
            .downcast_ref::<tokio::task::JoinError>()
            .is_some_and(|j| j.is_panic())
        {
            return true;
        }
        if let Some(DataFusionError::ExecutionJoin(j)) = err.downcast_ref::<DataFusionError>() {
            if j.is_panic() {
                return true;
            }
        }
        cur = err.source();
    }
    e.to_string().contains(PANIC_TEXT)
}

/// The SQLSTATE an error means, by what raised it: PostgreSQL's codes where one fits.
fn sqlstate(e: &(dyn std::error::Error + 'static)) -> &'static str {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(d) = err.downcast_ref::<DataFusionError>() {
            match d {
                DataFusionError::SQL(..) => return "42601",
                // out_of_memory: a memory limit of the server refused the query.
                DataFusionError::ResourcesExhausted(_) => return "53200",
                _ => {}
            }
        }
        if let Some(c) = err.downcast_ref::<crate::control::ControlError>() {
            return match c {
                crate::control::ControlError::Syntax { .. } => "42601",
                crate::control::ControlError::Store(crate::store::StoreError::UnknownTable(_)) => {
                    "42P01"
                }
                crate::control::ControlError::Store(_) => "XX000",
                _ => "22023",
            };
        }
        if err
            .downcast_ref::<datafusion::sql::sqlparser::parser::ParserError>()
            .is_some()
        {
            return "42601";
        }
        cur = err.source();
    }
    // Errors wrapped transparently lose their type on the way up; their messages are ours
    // and stable.
    let text = e.to_string();
    if text.contains("writes are fenced") || text.contains("is not writable") {
        "55000"
    } else if text.contains("kept conflicting after")
        || text.contains("could not serialize")
        || text.contains("nothing was changed, retry the statement")
    {
        "40001"
    } else if text.contains("table '") && text.contains("' not found") {
        "42P01"
    } else if text.contains("LIMIT must be >= 0") {
        // invalid_row_count_in_limit_clause
        "2201W"
    } else if text.contains("OFFSET must be >=0") {
        // invalid_row_count_in_result_offset_clause
        "2201X"
    } else if text.contains("must not be NULL") {
        // not_null_violation
        "23502"
    } else if text.contains("Resources exhausted") {
        "53200"
    } else if text.contains("SQL error") || text.contains("ParserError") {
        "42601"
    } else if text.contains("exceeded") && text.contains("limit") {
        "54000"
    } else {
        "XX000"
    }
}

/// Gives every error a meaningful SQLSTATE before it is sent.
#[derive(Debug)]
pub(super) struct SqlStates;

impl ErrorHandler for SqlStates {
    fn on_error<C>(&self, _client: &C, error: &mut PgWireError)
    where
        C: ClientInfo,
    {
        // A panic in a task DataFusion spawned (a repartition's input, a function run
        // there) comes back as an error whose message quotes the panic's: answered as any
        // caught panic ([`internal_error`]), the message left to the server's log.
        let panicked = match &*error {
            PgWireError::ApiError(e) => is_panic(e.as_ref()),
            PgWireError::UserError(info) => info.message.contains(PANIC_TEXT),
            _ => false,
        };
        if panicked {
            *error = internal_error();
            return;
        }
        if let PgWireError::ApiError(e) = error {
            let code = sqlstate(e.as_ref());
            *error = PgWireError::UserError(Box::new(ErrorInfo::new(
                "ERROR".into(),
                code.into(),
                e.to_string(),
            )));
        }
    }
}
