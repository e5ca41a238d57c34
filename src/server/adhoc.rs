//! Ad-hoc queries on the simple protocol, run as their statement shape: the literals of
//! the `WHERE` lifted into parameters ([`crate::prepared::shapes`]), the lifted statement
//! prepared once per connection in the same cache as the extended protocol's statements,
//! and executed with the values. A BI tool that sends each page as text then skips
//! parsing into plans, analysis and optimisation, and reuses the physical plan of a page
//! asked for again.
//!
//! Whatever does not fit is answered by the ordinary path, as written: statements that are
//! not a plain `SELECT`, shapes the gates refuse or that fail to prepare, values that would
//! not bind the way their literal would have been coerced, and binding errors. So answers,
//! refusals and error messages are those of the statement as written; only a statement's
//! execution errors (after its first row was asked for) come from the shape.

use datafusion::execution::SendableRecordBatchStream;
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser as SqlParser;
use datafusion_postgres::pgwire::api::portal::Format;
use datafusion_postgres::pgwire::api::results::Response;

use super::guard::{self, Kind};
use super::handlers::ConnSession;
use super::respond::{stream_response, Prepared};
use super::text::TextStyle;
use crate::prepared::shapes::{lift, Lifted};
use crate::prepared::PreparedError;

/// Texts at most this long are parsed and looked up on the runtime's worker
/// ([`run_cached`]); longer ones only off it ([`super::offload`]). A page is far shorter;
/// parsing a few kilobytes takes microseconds, but parsing never yields, and two 8 MB texts
/// parsed on the workers of a 2-core machine held every other client for 13-15 s.
pub(super) const ON_WORKER_BYTES: usize = 4096;

/// The answer to a query through its prepared shape `lifted` ([`shape_of`]), or `None` to
/// run it as written.
pub(super) async fn run(
    session: &ConnSession,
    lifted: &Lifted,
    style: TextStyle,
) -> Option<Response> {
    let prepared = session
        .prepared(&lifted.text, &lifted.statement)
        .await
        .ok()??;
    if !lifted.binds_to(prepared.query.parameter_types()) {
        return None;
    }
    answer(
        &prepared,
        prepared.query.execute_stream(&lifted.values).await,
        style,
    )
}

/// [`run`] when that plans nothing: the shape is prepared and current, and a physical plan
/// is cached for these values. `None` otherwise, for [`run`] to answer where planning may
/// take its time ([`super::offload`]).
pub(super) async fn run_cached(
    session: &ConnSession,
    lifted: &Lifted,
    style: TextStyle,
) -> Option<Response> {
    let prepared = session.cached(&lifted.text).await?;
    if !lifted.binds_to(prepared.query.parameter_types()) {
        return None;
    }
    let batches = prepared.query.execute_cached(&lifted.values)?;
    answer(&prepared, batches, style)
}

/// The shape of `query` if it has one to run as: a single plain `SELECT` the statement gate
/// lets through as a plan, its literals lifted.
pub(super) fn shape_of(query: &str) -> Option<Lifted> {
    let mut statements = SqlParser::parse_sql(&PostgreSqlDialect {}, query).ok()?;
    if statements.len() != 1 {
        return None;
    }
    let statement = statements.pop()?;
    // The statement gate judges what was written; the plan gate judges the shape's plan
    // (in `ConnSession::prepared`, as for the extended protocol).
    if !matches!(guard::statement_kind(&statement), Ok(Kind::Plan)) {
        return None;
    }
    lift(&statement)
}

/// The response of a shape's execution, as text in the session's `style`; `None` (run as
/// written) when it could not start.
fn answer(
    prepared: &Prepared,
    batches: Result<SendableRecordBatchStream, PreparedError>,
    style: TextStyle,
) -> Option<Response> {
    let batches = batches.ok()?;
    let fields = prepared.fields(&Format::UnifiedText, &style.options).ok()?;
    Some(stream_response(fields, batches, style))
}
