//! A Query message holding several statements (`SELECT 1; SELECT 2`): every statement is
//! judged before any runs, then each is planned off the runtime's workers
//! ([`super::offload`]) and its rows sent from the worker, one statement after another.

use std::fmt::Debug;

use datafusion_postgres::pgwire::api::portal::Format;
use datafusion_postgres::pgwire::api::query::SimpleQueryHandler;
use datafusion_postgres::pgwire::api::results::Response;
use datafusion_postgres::pgwire::api::store::PortalStore;
use datafusion_postgres::pgwire::api::{ClientInfo, ClientPortalStore};
use datafusion_postgres::pgwire::error::{PgWireError, PgWireResult};
use datafusion_postgres::pgwire::messages::PgWireBackendMessage;
use futures::Sink;

use super::guard::{self, authorize, Role};
use super::handlers::{control_statement, error, refine_parse_error, run_control};
use super::limits::{bound_rows, bounded};

/// A Query message holding several statements, run the way PostgreSQL runs them as far as
/// statements that each commit on their own allow: every statement is judged (its kind and
/// the role it needs, on its plan) before any runs, so a refusal leaves nothing done; then
/// they run one after another, each one's answer sent in full before the next starts, and
/// the first error ends the message (datafusion-postgres ran them all, then sent the
/// answers, so a failing SELECT was reported after the INSERT behind it had committed).
pub(super) async fn run<C>(
    login: &super::conn::Login,
    client: &mut C,
    query: &str,
    deadline: Option<(tokio::time::Instant, std::time::Duration)>,
    token: &tokio_util::sync::CancellationToken,
) -> PgWireResult<Vec<Response>>
where
    C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
    C::PortalStore: PortalStore,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    use datafusion_postgres::pgwire::api::query::{send_execution_response, send_query_response};

    let ctx = &login.session.ctx;
    let pieces = super::shape::split(query);
    // Judged, then each run, off the runtime's workers ([`super::offload`]); the rows of
    // each are sent on the worker, so a client that does not read holds no thread.
    super::offload::off_worker(judge(login, &pieces)).await?;
    let last = pieces.len() - 1;
    for (i, piece) in pieces.iter().enumerate() {
        let answers = super::offload::off_worker(bounded(deadline, token, async {
            match control_statement(piece)? {
                Some(statement) => Ok(vec![
                    run_control(ctx, login.role, &statement, &Format::UnifiedText).await?,
                ]),
                None => {
                    super::guard::no_dropped_subquery(piece)?;
                    SimpleQueryHandler::do_query(&*login.session.service, client, piece)
                        .await
                        .map_err(|e| refine_parse_error(e, piece))
                }
            }
        }))
        .await?;
        if i == last {
            return Ok(answers);
        }
        for mut answer in answers {
            // Rows of a statement before the last are sent here, under the same bounds.
            bound_rows(&mut answer, deadline, token);
            match answer {
                Response::Query(rows) => send_query_response(client, rows, true).await?,
                Response::Execution(tag)
                | Response::TransactionStart(tag)
                | Response::TransactionEnd(tag) => send_execution_response(client, tag).await?,
                // The split leaves out empty statements; nothing to send.
                Response::EmptyQuery => {}
                Response::Error(e) => return Err(PgWireError::UserError(e)),
                _ => {
                    return Err(error(
                        "ERROR",
                        "0A000",
                        "COPY is not supported over the wire".into(),
                    ))
                }
            }
        }
    }
    Ok(Vec::new())
}

/// Judges every statement of a several-statement Query (its kind and the role its plan
/// needs) before any runs.
async fn judge(login: &super::conn::Login, pieces: &[&str]) -> PgWireResult<()> {
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser as SqlParser;

    let ctx = &login.session.ctx;
    for piece in pieces {
        if control_statement(piece)?.is_some() {
            authorize(
                login.role,
                Role::Admin,
                "a control statement (ALTER TABLE, CREATE EXTERNAL TABLE, SYSTEM ... MOVES)",
            )?;
            continue;
        }
        // A statement that does not parse is reported when its turn comes, by the same
        // path as a single one.
        let Ok(statements) = SqlParser::parse_sql(&PostgreSqlDialect {}, piece) else {
            continue;
        };
        for s in &statements {
            if matches!(guard::statement_kind(s)?, guard::Kind::Plan) {
                let plan = super::hooks::plan_of(ctx, s).await?;
                authorize(login.role, guard::plan_need(&plan)?, "this statement")?;
            }
        }
    }
    Ok(())
}
