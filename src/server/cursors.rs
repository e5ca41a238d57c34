//! `DECLARE`, `FETCH` and `CLOSE` over the wire, on the judged plan and streamed.
//!
//! datafusion-postgres's cursor hook turns a cursor's query back into text and runs it with
//! `SessionContext::sql`, whose parser reads some text differently from the PostgreSQL
//! parser that judged it (a non-breaking space is part of an identifier to one and
//! whitespace to the other, so `x<U+00A0>INTO<U+00A0>t` was an alias when judged and a table
//! creation when run); and its `FETCH ALL` collects every remaining row first. Here the
//! cursor's query is planned once from the parsed statement, judged like any query, and
//! that plan is what runs; a `FETCH` streams at most its count of rows from the cursor and
//! leaves the rest in it. A `FETCH` that fails (its statement timeout, a cancel, the client
//! gone) closes the cursor, so its query stops instead of running on in the background.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::{CloseCursor, DeclareType, FetchDirection, Statement, Value};
use datafusion_postgres::hooks::HookClient;
use datafusion_postgres::pgwire::api::portal::{Format, Portal, PortalExecutionState};
use datafusion_postgres::pgwire::api::results::{QueryResponse, Response, Tag};
use datafusion_postgres::pgwire::api::stmt::StoredStatement;
use datafusion_postgres::pgwire::api::store::PortalStore;
use datafusion_postgres::pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use datafusion_postgres::pgwire::messages::data::DataRow;
use futures::Stream;
use tokio::sync::Mutex;

use super::guard::{self, authorize, Role};
use super::handlers::api;
use super::hooks::plan_of;
use super::respond::dataframe_response;
use super::text::TextStyle;

fn error(code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".into(),
        code.into(),
        message,
    )))
}

/// Runs a cursor statement for a user of `role`.
pub(super) async fn run(
    statement: &Statement,
    role: Role,
    ctx: &SessionContext,
    client: &mut dyn HookClient,
) -> PgWireResult<Response> {
    match statement {
        Statement::Declare { stmts } => {
            for declare in stmts {
                if declare.declare_type != Some(DeclareType::Cursor) {
                    return Err(error(
                        "42601",
                        "only DECLARE ... CURSOR FOR is supported".into(),
                    ));
                }
                let name = declare
                    .names
                    .first()
                    .ok_or_else(|| error("42601", "a cursor needs a name".into()))?
                    .value
                    .clone();
                let query = declare
                    .for_query
                    .as_ref()
                    .ok_or_else(|| error("42601", "DECLARE CURSOR needs a FOR query".into()))?;
                let plan = plan_of(ctx, &Statement::Query(query.clone())).await?;
                let need = guard::plan_need(&plan)?;
                authorize(role, need, "this cursor's query")?;
                let df = ctx.execute_logical_plan(plan.clone()).await.map_err(api)?;
                let style = TextStyle::of(client.metadata(), ctx);
                let rows = dataframe_response(df, style, &Format::UnifiedText).await?;
                // The plan goes with the cursor's portal, so a Describe of the portal (how
                // libpq drivers such as psycopg learn a server-side cursor's columns)
                // answers its row description: it answered NoData, and psycopg's binary
                // module crashed on the rows that followed.
                let stored = Arc::new(StoredStatement::new(
                    name.clone(),
                    (
                        query.to_string(),
                        Some((Statement::Query(query.clone()), plan)),
                    ),
                    vec![],
                ));
                let portal = Portal::new_cursor(name, stored);
                portal.start(rows).await;
                client.portal_store().put_portal(Arc::new(portal));
            }
            Ok(Response::Execution(Tag::new("DECLARE CURSOR")))
        }
        Statement::Fetch {
            name, direction, ..
        } => fetch(client, &name.value, direction).await,
        Statement::Close { cursor } => {
            match cursor {
                CloseCursor::All => client.portal_store().clear_portals(),
                CloseCursor::Specific { name } => client.portal_store().rm_portal(&name.value),
            }
            Ok(Response::Execution(Tag::new("CLOSE CURSOR")))
        }
        other => Err(guard::refused_statement(&other.to_string())),
    }
}

/// `FETCH`: at most the count's rows, streamed; the rest stays in the cursor.
async fn fetch(
    client: &mut dyn HookClient,
    name: &str,
    direction: &FetchDirection,
) -> PgWireResult<Response> {
    let count = |v: &Value| match v {
        Value::Number(n, _) => n
            .parse::<usize>()
            .map_err(|_| error("22023", format!("FETCH count {n} is not a row count"))),
        other => Err(error(
            "22023",
            format!("FETCH count {other} is not a row count"),
        )),
    };
    let limit = match direction {
        FetchDirection::Next | FetchDirection::Forward { limit: None } => Some(1),
        FetchDirection::Forward { limit: Some(v) } | FetchDirection::Count { limit: v } => {
            Some(count(v)?)
        }
        FetchDirection::ForwardAll | FetchDirection::All => None,
        _ => return Err(error("55000", "cursors scan forward only".into())),
    };
    let portal = match client.portal_store().get_portal(name) {
        Some(entry) => entry
            .value()
            .cloned()
            .ok_or_else(|| error("34000", format!("cursor \"{name}\" does not exist")))?,
        None => return Err(error("34000", format!("cursor \"{name}\" does not exist"))),
    };
    let state = portal.state();
    let taken = std::mem::take(&mut *state.lock().await);
    let rows = match taken {
        PortalExecutionState::Suspended(rows) => rows,
        // Fetched to its end already (or never started): no rows, as PostgreSQL answers.
        other => {
            *state.lock().await = match other {
                PortalExecutionState::Initial => PortalExecutionState::Initial,
                _ => PortalExecutionState::Finished,
            };
            let empty = futures::stream::empty::<PgWireResult<DataRow>>();
            let mut r = QueryResponse::new(Arc::new(vec![]), empty);
            r.command_tag = "FETCH".into();
            return Ok(Response::Query(r));
        }
    };
    let schema = rows.row_schema.clone();
    let stream = Fetching {
        rows: Some(rows),
        left: limit,
        state,
    };
    let mut response = QueryResponse::new(schema, stream);
    response.command_tag = "FETCH".into();
    Ok(Response::Query(response))
}

/// Rows of one `FETCH`: when its count is reached, the cursor keeps the rest; at the end of
/// the rows, on an error, or if the fetch is abandoned part way, the cursor is finished and
/// its query dropped.
struct Fetching {
    rows: Option<QueryResponse>,
    left: Option<usize>,
    state: Arc<Mutex<PortalExecutionState>>,
}

impl Fetching {
    fn settle(&mut self, keep: bool) {
        let rows = self.rows.take();
        let next = match (keep, rows) {
            (true, Some(r)) => PortalExecutionState::Suspended(r),
            _ => PortalExecutionState::Finished,
        };
        // Uncontended: a connection runs one statement at a time.
        if let Ok(mut s) = self.state.try_lock() {
            *s = next;
        }
    }
}

impl Stream for Fetching {
    type Item = PgWireResult<DataRow>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.left == Some(0) {
            this.settle(true);
            return Poll::Ready(None);
        }
        let Some(rows) = this.rows.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(&mut rows.data_rows).poll_next(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(row))) => {
                if let Some(n) = &mut this.left {
                    *n -= 1;
                }
                Poll::Ready(Some(Ok(row)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.settle(false);
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.settle(false);
                Poll::Ready(None)
            }
        }
    }
}

impl Drop for Fetching {
    fn drop(&mut self) {
        if self.rows.is_some() {
            // Abandoned part way (timeout, cancel, client gone): close the cursor.
            self.settle(false);
        }
    }
}
