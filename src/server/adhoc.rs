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

use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser as SqlParser;
use datafusion_postgres::pgwire::api::portal::Format;
use datafusion_postgres::pgwire::api::results::Response;

use super::guard::{self, Kind};
use super::handlers::{stream_response, ConnSession};
use crate::prepared::shapes::lift;

/// The answer to `query` through its prepared shape, or `None` to run it as written.
pub(super) async fn run(session: &ConnSession, query: &str) -> Option<Response> {
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
    let lifted = lift(&statement)?;
    let prepared = session
        .prepared(&lifted.text, &lifted.statement)
        .await
        .ok()??;
    if !lifted.binds_to(prepared.query.parameter_types()) {
        return None;
    }
    let batches = prepared.query.execute_stream(&lifted.values).await.ok()?;
    let fields = prepared.fields(&Format::UnifiedText).ok()?;
    Some(stream_response(fields, batches))
}
