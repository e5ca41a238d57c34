//! The hooks that decide what a logged-in connection's statements do, placed around
//! datafusion-postgres's own (cursors, SHOW, transactions).
//!
//! [`Guard`] goes first. It applies the statement gate, answers `SET`/`RESET` from the
//! allow-list and `SHOW` of those variables, and applies the plan gate; on the simple
//! protocol it then executes the judged plan itself. [`Unhandled`] goes last and refuses
//! whatever no hook answered.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{DFSchema, ParamValues};
use datafusion::logical_expr::{EmptyRelation, LogicalPlan, WriteOp};
use datafusion::prelude::{DataFrame, SessionContext};
use datafusion::sql::sqlparser::ast::Statement;
use datafusion_postgres::hooks::HookClient;
use datafusion_postgres::pgwire::api::portal::Format;
use datafusion_postgres::pgwire::api::results::{Response, Tag};
use datafusion_postgres::pgwire::api::ClientInfo;
use datafusion_postgres::pgwire::error::PgWireResult;
use datafusion_postgres::pgwire::messages::startup::ParameterStatus;
use datafusion_postgres::pgwire::messages::PgWireBackendMessage;
use datafusion_postgres::QueryHook;

use super::guard::{self, authorize, Kind, Role};
use super::handlers::api;
use super::respond::{batch_response, dataframe_response};
use super::text::TextStyle;
use super::vars;

/// The first hook: the statement gate, `SET`/`RESET` from the allow-list, the plan gate,
/// and on the simple protocol the execution of the judged plan.
#[derive(Debug)]
pub(super) struct Guard {
    role: Role,
}

impl Guard {
    pub(super) fn new(role: Role) -> Self {
        Self { role }
    }

    /// Plans `statement`, judges the plan and runs it (the simple protocol).
    async fn run_plan(
        &self,
        statement: &Statement,
        ctx: &SessionContext,
        client: &mut dyn HookClient,
    ) -> PgWireResult<Response> {
        let plan = plan_of(ctx, statement).await?;
        let need = guard::plan_need(&plan)?;
        authorize(self.role, need, what(statement))?;
        let dml = match &plan {
            LogicalPlan::Dml(d) => Some(d.op.clone()),
            _ => None,
        };
        let df = ctx.execute_logical_plan(plan).await.map_err(api)?;
        if let Some(op) = dml {
            return dml_response(df, &op).await;
        }
        let style = TextStyle::of(client.metadata(), ctx);
        Ok(Response::Query(
            dataframe_response(df, style, &Format::UnifiedText).await?,
        ))
    }
}

pub(super) fn what(statement: &Statement) -> &'static str {
    match statement {
        Statement::Insert(_) => "INSERT",
        Statement::Delete(_) => "DELETE",
        Statement::Update(_) => "UPDATE",
        _ => "this statement",
    }
}

pub(super) async fn plan_of(
    ctx: &SessionContext,
    statement: &Statement,
) -> PgWireResult<LogicalPlan> {
    crate::provider::defaults::plan_statement(ctx, &ctx.state(), statement)
        .await
        .map_err(api)
}

/// A row change's answer, as PostgreSQL tags it: `INSERT 0 n`, `DELETE n`, `UPDATE n`, with
/// no rows (DataFusion answers a change with a one-row `count` table, which a client that
/// was told at Describe that the statement returns no rows cannot take).
pub(super) async fn dml_response(df: DataFrame, op: &WriteOp) -> PgWireResult<Response> {
    let batches = df.collect().await.map_err(api)?;
    let rows = batches
        .first()
        .and_then(|b| b.column_by_name("count"))
        .and_then(|c| {
            c.as_any()
                .downcast_ref::<datafusion::arrow::array::UInt64Array>()
                .map(|a| a.value(0))
        })
        .unwrap_or(0);
    let rows = usize::try_from(rows).unwrap_or(usize::MAX);
    Ok(Response::Execution(match op {
        WriteOp::Insert(_) => Tag::new("INSERT").with_oid(0).with_rows(rows),
        WriteOp::Delete => Tag::new("DELETE").with_rows(rows),
        WriteOp::Update => Tag::new("UPDATE").with_rows(rows),
        other => Tag::new(&other.name().to_uppercase()).with_rows(rows),
    }))
}

/// Applies a `SET`/`RESET` to the connection and reports what PostgreSQL reports.
async fn set_variable(
    statement: &Statement,
    ctx: &SessionContext,
    client: &mut dyn HookClient,
) -> PgWireResult<Response> {
    let change = vars::change(statement)?;
    vars::apply(&change, client.metadata_mut(), ctx);
    for (name, value) in change.report {
        client
            .send_message(PgWireBackendMessage::ParameterStatus(ParameterStatus::new(
                name, value,
            )))
            .await?;
    }
    Ok(Response::Execution(Tag::new(match statement {
        Statement::Reset(_) => "RESET",
        _ => "SET",
    })))
}

/// What a `SHOW` asks for.
enum Show {
    /// A variable of the allow-list (or `ALL`): its name and the answer's columns.
    Ours(String, Vec<String>),
    /// One datafusion-postgres's SHOW hook answers (server_version, transaction_isolation).
    Theirs,
    /// Anything else: 42704, as PostgreSQL answers an unknown parameter.
    Unknown(datafusion_postgres::pgwire::error::PgWireError),
}

/// The SHOWs datafusion-postgres answers, and we let it.
const THEIRS: [&str; 3] = [
    "server_version",
    "transaction_isolation",
    "transaction isolation level",
];

fn show_target(statement: &Statement) -> Show {
    let Statement::ShowVariable { variable } = statement else {
        return Show::Theirs;
    };
    let name = variable
        .iter()
        .map(|i| i.value.to_lowercase())
        .collect::<Vec<_>>()
        .join(" ");
    if name == "all" {
        let columns = ["name", "setting", "description"]
            .map(String::from)
            .to_vec();
        return Show::Ours(name, columns);
    }
    if THEIRS.contains(&name.as_str()) {
        return Show::Theirs;
    }
    if vars::show(&name, &Default::default()).is_none() {
        return Show::Unknown(datafusion_postgres::pgwire::error::PgWireError::UserError(
            Box::new(datafusion_postgres::pgwire::error::ErrorInfo::new(
                "ERROR".into(),
                "42704".into(),
                format!("unrecognized configuration parameter \"{name}\""),
            )),
        ));
    }
    let column = if name == "time zone" {
        "TimeZone".to_string()
    } else {
        name.clone()
    };
    Show::Ours(name, vec![column])
}

/// An empty relation with these text columns: the plan of a statement answered by a hook.
fn empty_plan(fields: Vec<Field>) -> PgWireResult<LogicalPlan> {
    DFSchema::try_from(Schema::new(fields))
        .map(|schema| {
            LogicalPlan::EmptyRelation(EmptyRelation {
                produce_one_row: false,
                schema: Arc::new(schema),
            })
        })
        .map_err(api)
}

/// `SHOW name` for a variable of the allow-list, or `SHOW ALL`; `None` for the SHOWs
/// datafusion-postgres answers; 42704 for anything else.
fn show_variable(statement: &Statement, client: &dyn HookClient) -> Option<PgWireResult<Response>> {
    let (name, _) = match show_target(statement) {
        Show::Ours(name, columns) => (name, columns),
        Show::Theirs => return None,
        Show::Unknown(e) => return Some(Err(e)),
    };
    let text = |v: Vec<String>| Arc::new(datafusion::arrow::array::StringArray::from(v)) as _;
    let batch = if name == "all" {
        let names: Vec<String> = vars::ALLOWED.iter().map(|n| n.to_string()).collect();
        let values: Vec<String> = vars::ALLOWED
            .iter()
            .map(|n| vars::show(n, client.metadata()).unwrap_or_default())
            .collect();
        let schema = Schema::new(vec![
            Field::new("name", DataType::Utf8, false),
            Field::new("setting", DataType::Utf8, false),
            Field::new("description", DataType::Utf8, false),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                text(names),
                text(values),
                text(vec![String::new(); vars::ALLOWED.len()]),
            ],
        )
    } else {
        let value = vars::show(&name, client.metadata()).unwrap_or_default();
        let column = if name == "time zone" {
            "TimeZone".to_string()
        } else {
            name
        };
        let schema = Schema::new(vec![Field::new(column, DataType::Utf8, false)]);
        RecordBatch::try_new(Arc::new(schema), vec![text(vec![value])])
    };
    Some(
        batch
            .map_err(api)
            .and_then(|b| batch_response(b, &Format::UnifiedText)),
    )
}

#[async_trait]
impl QueryHook for Guard {
    async fn handle_simple_query(
        &self,
        statement: &Statement,
        ctx: &SessionContext,
        client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        match guard::statement_kind(statement) {
            Err(e) => Some(Err(e)),
            Ok(Kind::Variable) => Some(set_variable(statement, ctx, client).await),
            Ok(Kind::Show) => show_variable(statement, client),
            Ok(Kind::Transaction) => None,
            Ok(Kind::Cursor) => Some(super::cursors::run(statement, self.role, ctx, client).await),
            Ok(Kind::Plan) => Some(self.run_plan(statement, ctx, client).await),
        }
    }

    async fn handle_extended_parse_query(
        &self,
        statement: &Statement,
        ctx: &SessionContext,
        _client: &(dyn ClientInfo + Send + Sync),
    ) -> Option<PgWireResult<LogicalPlan>> {
        match guard::statement_kind(statement) {
            Err(e) => Some(Err(e)),
            Ok(Kind::Variable) => Some(empty_plan(vec![])),
            Ok(Kind::Show) => match show_target(statement) {
                Show::Ours(_, columns) => Some(empty_plan(
                    columns
                        .iter()
                        .map(|c| Field::new(c, DataType::Utf8, false))
                        .collect(),
                )),
                Show::Theirs => None,
                Show::Unknown(e) => Some(Err(e)),
            },
            Ok(Kind::Transaction) => None,
            // A cursor statement answers no rows at Execute time from the plan; its query is
            // planned and judged when it runs (`cursors::run`), and here already, to fail early.
            Ok(Kind::Cursor) => Some(
                async {
                    if let Statement::Declare { stmts } = statement {
                        for d in stmts {
                            if let Some(q) = &d.for_query {
                                let plan = plan_of(ctx, &Statement::Query(q.clone())).await?;
                                authorize(
                                    self.role,
                                    guard::plan_need(&plan)?,
                                    "this cursor's query",
                                )?;
                            }
                        }
                    }
                    empty_plan(vec![])
                }
                .await,
            ),
            Ok(Kind::Plan) => Some(
                async {
                    let plan = plan_of(ctx, statement).await?;
                    let need = guard::plan_need(&plan)?;
                    authorize(self.role, need, what(statement))?;
                    Ok(plan)
                }
                .await,
            ),
        }
    }

    async fn handle_extended_query(
        &self,
        statement: &Statement,
        plan: &LogicalPlan,
        params: &ParamValues,
        ctx: &SessionContext,
        client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        match guard::statement_kind(statement) {
            Err(e) => Some(Err(e)),
            Ok(Kind::Variable) => Some(set_variable(statement, ctx, client).await),
            Ok(Kind::Show) => show_variable(statement, client),
            Ok(Kind::Transaction) => None,
            Ok(Kind::Cursor) => Some(super::cursors::run(statement, self.role, ctx, client).await),
            // The plan made at Parse, judged again; datafusion-postgres executes a query as
            // is. A row change runs here, so that it answers with its own tag and no rows.
            Ok(Kind::Plan) => match guard::plan_need(plan)
                .and_then(|need| authorize(self.role, need, what(statement)))
            {
                Ok(()) => match plan {
                    LogicalPlan::Dml(d) => Some(
                        async {
                            let bound = plan
                                .clone()
                                .with_param_values(params.clone())
                                .map_err(api)?;
                            let df = ctx.execute_logical_plan(bound).await.map_err(api)?;
                            dml_response(df, &d.op).await
                        }
                        .await,
                    ),
                    _ => None,
                },
                Err(e) => Some(Err(e)),
            },
        }
    }
}

/// The last hook: whatever no earlier hook answered is refused, so no statement reaches
/// datafusion-postgres's own execution (which plans text with `SessionContext::sql`). The
/// one exception is a planned statement at the extended protocol's Execute with a parameter
/// of no known type (most run in `handlers::run_planned` instead): the [`Guard`] judged its
/// plan just before, and datafusion-postgres executes exactly that plan.
#[derive(Debug)]
pub(super) struct Unhandled;

#[async_trait]
impl QueryHook for Unhandled {
    async fn handle_simple_query(
        &self,
        statement: &Statement,
        _ctx: &SessionContext,
        _client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        Some(Err(guard::refused_statement(&statement.to_string())))
    }

    async fn handle_extended_parse_query(
        &self,
        statement: &Statement,
        _ctx: &SessionContext,
        _client: &(dyn ClientInfo + Send + Sync),
    ) -> Option<PgWireResult<LogicalPlan>> {
        Some(Err(guard::refused_statement(&statement.to_string())))
    }

    async fn handle_extended_query(
        &self,
        statement: &Statement,
        _plan: &LogicalPlan,
        _params: &ParamValues,
        _ctx: &SessionContext,
        _client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        match guard::statement_kind(statement) {
            Ok(Kind::Plan) => None,
            _ => Some(Err(guard::refused_statement(&statement.to_string()))),
        }
    }
}
