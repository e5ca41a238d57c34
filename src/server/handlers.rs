//! The statement path of a logged-in connection: its own session, the gates of
//! [`super::guard`], execution inside the statement timeout and the client's cancel
//! request, results streamed to the client (the SQLSTATE each error carries is
//! [`super::sqlstate`]'s).
//!
//! datafusion-postgres brings the protocol glue (its `DfSessionService`, the PostgreSQL
//! dialect parser, `SHOW`, transactions and cursors as hooks, Arrow to PostgreSQL type
//! encoding); the [`Guard`](super::hooks::Guard) hook goes first and decides what runs. On the simple protocol it
//! plans each statement once, judges the plan and executes that plan itself (datafusion-
//! postgres would hand the text to `SessionContext::sql`, which executes DDL while
//! planning). On the extended protocol the plan is made and judged at Parse, judged again at
//! Execute, and executed by datafusion-postgres unchanged. A hook at the end refuses
//! whatever no hook answered, so nothing reaches DataFusion's own execution unjudged.
//!
//! A query parsed once by the extended protocol runs as a [`PreparedQuery`], cached per
//! connection, so a driver's latest-N page takes the prepared hot path. Rows are never
//! collected: each response's row stream is bounded by the statement's deadline and its
//! cancel token, and pgwire writes rows as the socket takes them.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{DFSchema, ParamValues, ScalarValue};
use datafusion::error::DataFusionError;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::logical_expr::{EmptyRelation, LogicalPlan};
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::Statement as DFStatementAst;
use datafusion::sql::sqlparser::ast::Statement;
use datafusion_postgres::arrow_pg::datatypes::df::deserialize_parameters;
use datafusion_postgres::hooks::set_show::SetShowHook;
use datafusion_postgres::hooks::transactions::TransactionStatementHook;
use datafusion_postgres::pgwire::api::portal::{Format, Portal};
use datafusion_postgres::pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use datafusion_postgres::pgwire::api::results::{FieldInfo, Response};
use datafusion_postgres::pgwire::api::stmt::QueryParser;
use datafusion_postgres::pgwire::api::store::PortalStore;
use datafusion_postgres::pgwire::api::{ClientInfo, ClientPortalStore, Type};
use datafusion_postgres::pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use datafusion_postgres::pgwire::messages::PgWireBackendMessage;
use datafusion_postgres::{DfSessionService, Parser, QueryHook};
use futures::Sink;

use super::conn::ConnState;
use super::guard::{self, authorize, Kind, Role};
use super::hooks::{Guard, Unhandled};
use super::limits::{bound_rows, bounded, deadline};
use super::memory::QueryPool;
use super::respond::{batch_response, stream_response, Prepared};
pub(super) use super::sqlstate::{api, internal_error, SqlStates};
use super::text::{session_zone, TextStyle};
use super::Shared;
use crate::control::{ControlHandle, ControlStatement};
use crate::lru::Lru;
use crate::prepared::shapes::Lifted;
use crate::prepared::{prepare_parsed, PreparedError};

/// Statements kept prepared per connection (least recently used out).
const PREPARED_PER_CONNECTION: usize = 64;

/// Texts of ad-hoc queries remembered per connection with their shape (least recently used
/// out); each at most `adhoc::ON_WORKER_BYTES`, so at most 256 KiB of text.
const REMEMBERED_TEXTS: usize = 64;

/// The extended protocol's statement type, as datafusion-postgres parses it (kept, so its
/// cursor hook's downcast stays valid).
pub(super) type DfStatement = (String, Option<(Statement, LogicalPlan)>);

pub(super) fn error(severity: &str, code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        severity.into(),
        code.into(),
        message,
    )))
}

/// A connection's own session over the server's shared catalog and caches, and the pgwire
/// glue around it.
pub(super) struct ConnSession {
    pub(super) ctx: Arc<SessionContext>,
    pub(super) service: Arc<DfSessionService>,
    role: Role,
    prepared: Mutex<Lru<String, Option<Arc<Prepared>>>>,
    /// Texts answered through their shape, with the shape ([`Self::remembered`]).
    texts: Mutex<Lru<String, Arc<Lifted>>>,
}

impl ConnSession {
    /// Forks the server's session: the same catalog (tables, caches, the pg_catalog
    /// emulation), its own configuration (time zone, settings) and its own memory pool, a
    /// share of the server's.
    pub(super) fn new(shared: &Shared, role: Role) -> Result<Self, DataFusionError> {
        let base = shared.base.state();
        let pool = Arc::new(QueryPool::new(
            shared.config.query_memory_limit,
            shared.pool.clone(),
        ));
        let runtime = RuntimeEnvBuilder::from_runtime_env(base.runtime_env())
            .with_memory_pool(pool)
            .build_arc()?;
        let mut state = SessionStateBuilder::new_from_existing(base)
            .with_runtime_env(runtime)
            .build();
        if role < Role::Admin {
            state
                .config_mut()
                .set_extension(Arc::new(crate::control::system::HideJobDetails));
        }
        let ctx = Arc::new(SessionContext::new_with_state(state));
        let hooks: Vec<Arc<dyn QueryHook>> = vec![
            Arc::new(Guard::new(role)),
            Arc::new(SetShowHook),
            Arc::new(TransactionStatementHook),
            Arc::new(Unhandled),
        ];
        let service = Arc::new(DfSessionService::new_with_hooks(ctx.clone(), hooks));
        Ok(Self {
            ctx,
            service,
            role,
            prepared: Mutex::new(Lru::new(PREPARED_PER_CONNECTION)),
            texts: Mutex::new(Lru::new(REMEMBERED_TEXTS)),
        })
    }

    /// The shape of `query` if this connection answered the very same text through it before
    /// ([`Self::remember`]). A text's checks, its parse and its lifted shape depend on the
    /// text alone; whether the shape is still current is asked where it runs, as for any.
    pub(super) fn remembered(&self, query: &str) -> Option<Arc<Lifted>> {
        if query.len() > super::adhoc::ON_WORKER_BYTES {
            return None;
        }
        self.texts.lock().expect("texts lock").get(query)
    }

    /// Remembers that `query`, a single statement that passed the server's checks and is not
    /// a control statement, was answered through `lifted`; only texts short enough to be
    /// parsed on the worker, so the memory this takes is bounded.
    pub(super) fn remember(&self, query: &str, lifted: &Arc<Lifted>) {
        if query.len() > super::adhoc::ON_WORKER_BYTES {
            return;
        }
        self.texts
            .lock()
            .expect("texts lock")
            .insert(query.to_string(), lifted.clone());
    }

    /// The prepared-plan cache's key of `sql`: plans depend on the session's time zone.
    fn cache_key(&self, sql: &str) -> String {
        session_zone(&self.ctx, |z| format!("{}\0{sql}", z.unwrap_or("")))
    }

    /// The cached prepared query for `sql`, if there is one and it is current, without
    /// preparing anything: `None` when [`Self::prepared`] would have to prepare.
    pub(super) async fn cached(&self, sql: &str) -> Option<Arc<Prepared>> {
        let hit = self
            .prepared
            .lock()
            .expect("prepared lock")
            .get(&self.cache_key(sql))??;
        hit.query.is_current().await.ok()?.then_some(hit)
    }

    /// The prepared query for `sql`, or `None` when it is not a query (an INSERT, a
    /// statement a hook answers): those go to datafusion-postgres every time. A query whose
    /// plan the gates refuse is refused here.
    ///
    /// The query is planned from the statement the server's PostgreSQL parser produced (and
    /// judged), never from its text again; it is cached under its text and the connection's
    /// time zone, which the plan depends on.
    pub(super) async fn prepared(
        &self,
        sql: &str,
        statement: &Statement,
    ) -> PgWireResult<Option<Arc<Prepared>>> {
        let key = self.cache_key(sql);
        let hit = self.prepared.lock().expect("prepared lock").get(&key);
        if let Some(hit) = hit {
            let current = match &hit {
                Some(p) => p.query.is_current().await.map_err(api)?,
                None => true,
            };
            if current {
                return Ok(hit);
            }
            // A declared table's schema changed since: prepared again below. If the
            // answer's columns changed, the client's description of them is wrong, and the
            // statement is refused as PostgreSQL does, to be prepared again by the client.
            let fresh = super::offload::off_worker(self.prepare_uncached(statement)).await?;
            let changed = match (&hit, &fresh) {
                (Some(old), Some(new)) => old.schema != new.schema,
                _ => false,
            };
            self.prepared
                .lock()
                .expect("prepared lock")
                .insert(key, fresh.clone());
            if changed {
                return Err(result_type_changed());
            }
            return Ok(fresh);
        }
        let p = super::offload::off_worker(self.prepare_uncached(statement)).await?;
        self.prepared
            .lock()
            .expect("prepared lock")
            .insert(key, p.clone());
        Ok(p)
    }

    /// Prepares a statement, without the cache.
    async fn prepare_uncached(&self, statement: &Statement) -> PgWireResult<Option<Arc<Prepared>>> {
        Ok(match prepare_parsed(&self.ctx, statement).await {
            Ok(p) if p.is_query() => {
                let need = guard::plan_need(p.logical_plan())?;
                authorize(self.role, need, "this statement")?;
                Some(Arc::new(Prepared::new(p)))
            }
            Ok(_) | Err(PreparedError::NotAQuery(_)) => None,
            // Anything else (a parse error of this planner, say) is left to the general path,
            // which reports it the way every other statement's error is reported.
            Err(_) => None,
        })
    }
}

/// PostgreSQL's refusal of a prepared statement whose result columns changed.
fn result_type_changed() -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".into(),
        "0A000".into(),
        "cached plan must not change result type: a table's columns changed since the \
         statement was prepared; prepare it again"
            .into(),
    )))
}

/// Whether two results have the same columns (names and types), as a client sees them.
fn same_columns(
    a: &datafusion::arrow::datatypes::Schema,
    b: &datafusion::arrow::datatypes::Schema,
) -> bool {
    a.fields().len() == b.fields().len()
        && a.fields()
            .iter()
            .zip(b.fields())
            .all(|(x, y)| x.name() == y.name() && x.data_type() == y.data_type())
}

/// Runs a control statement for an admin; everyone else is refused before it touches the
/// store.
pub(super) async fn run_control(
    ctx: &SessionContext,
    role: Role,
    statement: &ControlStatement,
    format: &Format,
) -> PgWireResult<Response> {
    authorize(
        role,
        Role::Admin,
        "a control statement (ALTER TABLE, CREATE EXTERNAL TABLE, SYSTEM ... MOVES)",
    )?;
    let store = ctx
        .state()
        .config()
        .get_extension::<ControlHandle>()
        .ok_or_else(|| api(crate::control::ControlError::NoStore))?
        .store
        .clone();
    let batch = crate::control::run_in(ctx, &*store, statement)
        .await
        .map_err(api)?;
    batch_response(batch, format)
}

/// The control statement `text` is, if it is one.
pub(super) fn control_statement(text: &str) -> PgWireResult<Option<ControlStatement>> {
    crate::control::recognize(text).map_err(api)
}

/// A text the PostgreSQL parser refused may still be a DataFusion-only statement (`CREATE
/// EXTERNAL TABLE`, `COPY ... TO`): that is refused as not allowed, not as a syntax error.
pub(super) fn refine_parse_error(e: PgWireError, text: &str) -> PgWireError {
    let parse_error = matches!(&e, PgWireError::ApiError(inner)
        if inner.downcast_ref::<datafusion::sql::sqlparser::parser::ParserError>().is_some()
            || inner.downcast_ref::<DataFusionError>().is_some_and(|d| matches!(d, DataFusionError::SQL(..))));
    if !parse_error {
        return e;
    }
    match datafusion::sql::parser::DFParser::parse_sql(text) {
        Ok(statements)
            if statements.iter().any(|s| {
                matches!(
                    s,
                    DFStatementAst::CreateExternalTable(_) | DFStatementAst::CopyTo(_)
                )
            }) =>
        {
            guard::refused_statement(text)
        }
        _ => e,
    }
}

/// The types a plan expects of its parameters, `$1` first.
pub(super) fn parameter_types(plan: &LogicalPlan) -> PgWireResult<Vec<Option<DataType>>> {
    let types = plan.get_parameter_types().map_err(api)?;
    Ok((1..=types.len())
        .map(|i| types.get(&format!("${i}")).cloned().flatten())
        .collect())
}

/// The simple protocol: control statements first, then datafusion-postgres's statement
/// loop with the hooks.
pub(super) struct Simple {
    conn: Arc<ConnState>,
}

impl Simple {
    pub(super) fn new(conn: Arc<ConnState>) -> Self {
        Self { conn }
    }
}

#[async_trait]
impl SimpleQueryHandler for Simple {
    /// Each statement is parsed and planned off the runtime's workers
    /// ([`super::offload`]), unless it is a page whose shape has a plan cached for its
    /// values; its rows are sent on the worker, by the caller afterwards (or by
    /// [`several`], between statements).
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let login = self.conn.login()?;
        // A text answered through its shape before was checked, parsed and lifted then; the
        // same text is not again (a dashboard sends the same page over and over).
        let remembered = login.session.remembered(query);
        let statements = match &remembered {
            Some(_) => 1,
            None => super::shape::check(query)?.statements,
        };
        let token = self.conn.statement.begin();
        let deadline = deadline(self.conn.shared.config.statement_timeout, &*client);
        // Several statements are bounded one at a time (each has its own commit gate), so a
        // write that committed in one does not exempt the others from the deadline.
        if statements > 1 {
            let mut out = super::several::run(login, client, query, deadline, &token).await?;
            for r in &mut out {
                bound_rows(r, deadline, &token);
            }
            return Ok(out);
        }
        // A short text is parsed and its shape looked up on the worker, and the page asked
        // for again, its plan cached for these values, runs there. Anything that plans, and
        // any long text (its parse alone, which never yields, could hold the worker for
        // seconds), goes off it; the shape found here is not looked for again there.
        let mut known: Option<Option<Arc<Lifted>>> = remembered.clone().map(Some);
        let style = TextStyle::of(client.metadata(), &login.session.ctx);
        if query.len() <= super::adhoc::ON_WORKER_BYTES {
            let (answer, lifted) = bounded(deadline, &token, async {
                let lifted = match remembered {
                    Some(l) => Some(l),
                    None if control_statement(query)?.is_some() => return Ok((None, None)),
                    None => super::adhoc::shape_of(query).map(Arc::new),
                };
                let answer = match &lifted {
                    Some(l) => super::adhoc::run_cached(&login.session, l, style.clone()).await,
                    None => None,
                };
                if let (Some(_), Some(l)) = (&answer, &lifted) {
                    login.session.remember(query, l);
                }
                Ok((answer, Some(lifted)))
            })
            .await?;
            if let Some(mut answer) = answer {
                bound_rows(&mut answer, deadline, &token);
                return Ok(vec![answer]);
            }
            known = lifted;
        }
        let mut out = super::offload::off_worker(bounded(deadline, &token, async {
            if let Some(statement) = control_statement(query)? {
                let ctx = &login.session.ctx;
                return Ok(vec![
                    run_control(ctx, login.role, &statement, &Format::UnifiedText).await?,
                ]);
            }
            // An ad-hoc query runs as its prepared shape when it has one.
            let lifted = known.unwrap_or_else(|| super::adhoc::shape_of(query).map(Arc::new));
            if let Some(lifted) = &lifted {
                if let Some(answer) = super::adhoc::run(&login.session, lifted, style.clone()).await
                {
                    login.session.remember(query, lifted);
                    return Ok(vec![answer]);
                }
            }
            guard::no_dropped_subquery(query)?;
            SimpleQueryHandler::do_query(&*login.session.service, client, query)
                .await
                .map_err(|e| refine_parse_error(e, query))
        }))
        .await?;
        for r in &mut out {
            bound_rows(r, deadline, &token);
        }
        Ok(out)
    }
}

/// Parses for the extended protocol: a control statement is kept as its text (it is
/// recognised again at Execute, from that text), with its answer's columns as the plan;
/// anything else is parsed and planned by datafusion-postgres with the hooks.
pub(super) struct ControlAwareParser {
    conn: Arc<ConnState>,
}

impl ControlAwareParser {
    fn inner(&self) -> Arc<Parser> {
        match self.conn.login() {
            Ok(login) => login.session.service.query_parser(),
            // Before the login (never reached: the connection loop refuses), a parser whose
            // only hook refuses everything.
            Err(_) => self.conn.shared.refusing.query_parser(),
        }
    }
}

#[async_trait]
impl QueryParser for ControlAwareParser {
    type Statement = DfStatement;

    async fn parse_sql<C>(
        &self,
        client: &C,
        sql: &str,
        types: &[Option<Type>],
    ) -> PgWireResult<Option<DfStatement>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        self.conn.login()?;
        if super::shape::check(sql)?.statements > 1 {
            return Err(error(
                "ERROR",
                "42601",
                "cannot insert multiple commands into a prepared statement".into(),
            ));
        }
        if let Some(statement) = control_statement(sql)? {
            let answer = crate::control::answer_schema(&statement);
            let schema = DFSchema::try_from(answer.as_ref().clone()).map_err(api)?;
            let plan = LogicalPlan::EmptyRelation(EmptyRelation {
                produce_one_row: false,
                schema: Arc::new(schema),
            });
            // The statement half is a placeholder: Execute recognises the text and never
            // hands a control statement to a hook.
            let placeholder = Statement::Flush {
                object_type: datafusion::sql::sqlparser::ast::FlushType::Tables,
                location: None,
                channel: None,
                read_lock: false,
                export: false,
                tables: vec![],
            };
            return Ok(Some((sql.to_string(), Some((placeholder, plan)))));
        }
        guard::no_dropped_subquery(sql)?;
        // Planned here, off the runtime's workers ([`super::offload`]).
        let parsed = super::offload::off_worker(self.inner().parse_sql(client, sql, types))
            .await
            .map_err(|e| refine_parse_error(e, sql))?;
        Ok(match parsed {
            Some((text, Some((statement, plan)))) => {
                Some((text, Some((statement, super::params::typed_limits(plan)?))))
            }
            other => other,
        })
    }

    fn get_parameter_types(&self, stmt: &DfStatement) -> PgWireResult<Vec<Type>> {
        self.inner().get_parameter_types(stmt)
    }

    fn get_result_schema(
        &self,
        stmt: &DfStatement,
        column_format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        self.inner().get_result_schema(stmt, column_format)
    }
}

/// The extended protocol, one per connection.
pub(super) struct Extended {
    conn: Arc<ConnState>,
    parser: Arc<ControlAwareParser>,
}

impl Extended {
    pub(super) fn new(conn: Arc<ConnState>) -> Self {
        Self {
            parser: Arc::new(ControlAwareParser { conn: conn.clone() }),
            conn,
        }
    }
}

#[async_trait]
impl ExtendedQueryHandler for Extended {
    type Statement = DfStatement;
    type QueryParser = ControlAwareParser;

    fn query_parser(&self) -> Arc<ControlAwareParser> {
        self.parser.clone()
    }

    /// Binds a portal; see [`super::execute::bind`] (`BindComplete` queued, not flushed).
    async fn on_bind<C>(
        &self,
        client: &mut C,
        message: datafusion_postgres::pgwire::messages::extendedquery::Bind,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = DfStatement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        super::execute::bind(client, message).await
    }

    async fn on_execute<C>(
        &self,
        client: &mut C,
        message: datafusion_postgres::pgwire::messages::extendedquery::Execute,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = DfStatement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        super::execute::execute(self, client, message).await
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<DfStatement>,
        max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = DfStatement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let login = self.conn.login()?;
        let token = self.conn.statement.begin();
        let deadline = deadline(self.conn.shared.config.statement_timeout, &*client);
        let sql = portal.statement.statement.0.as_str();
        let work = bounded(deadline, &token, async {
            if let Some(statement) = control_statement(sql)? {
                return run_control(
                    &login.session.ctx,
                    login.role,
                    &statement,
                    &portal.result_column_format,
                )
                .await;
            }
            // Only a query takes the prepared path: anything else (SHOW, which DataFusion
            // would also plan as a query) is the hooks' to answer.
            let prepared = match &portal.statement.statement.1 {
                Some((statement @ Statement::Query(_), described)) => {
                    let p = login.session.prepared(sql, statement).await?;
                    // The columns the client was told at Parse must be the ones it gets,
                    // whichever statement (of this text) brought the cache up to date.
                    if let Some(p) = &p {
                        if !same_columns(described.schema().as_arrow(), &p.schema) {
                            return Err(result_type_changed());
                        }
                    }
                    p
                }
                _ => None,
            };
            if let Some(p) = prepared {
                let expected: Vec<Option<DataType>> = p
                    .query
                    .parameter_types()
                    .iter()
                    .cloned()
                    .map(Some)
                    .collect();
                super::params::check(portal, &expected)?;
                let types: Vec<Option<&DataType>> =
                    p.query.parameter_types().iter().map(Some).collect();
                let mut values: Vec<ScalarValue> = match deserialize_parameters(portal, &types)? {
                    ParamValues::List(v) => v.into_iter().map(|s| s.value).collect(),
                    ParamValues::Map(_) => Vec::new(),
                };
                super::params::check_decoded(portal, &values)?;
                super::params::local_times_in_zone(
                    portal,
                    p.query.parameter_types(),
                    &mut values,
                    p.query.zone(),
                );
                // A physical plan cached for these values runs on the worker (the hot
                // page); one to plan, off it ([`super::offload`]).
                let batches = match p.query.execute_cached(&values) {
                    Some(ready) => ready.map_err(api)?,
                    None => {
                        super::offload::off_worker(bounded(deadline, &token, async {
                            p.query.execute_stream(&values).await.map_err(api)
                        }))
                        .await?
                    }
                };
                let style = TextStyle::of(client.metadata(), &login.session.ctx);
                let fields = p.fields(&portal.result_column_format, &style.options)?;
                return Ok(stream_response(fields, batches, style));
            }
            if let (_, Some((statement, plan))) = &portal.statement.statement {
                let types = parameter_types(plan)?;
                super::params::check(portal, &types)?;
                // A planned statement off the prepared path (`LIMIT $1`, a row change) runs
                // here rather than in datafusion-postgres, so that its parameters and its
                // rows are read and written in the session's zone and styles as on the
                // prepared path.
                // Only when every parameter has a type, the plan's or the client's: one that
                // has neither (`$1::int` types the cast, not `$1`) is decoded by
                // datafusion-postgres, which infers it from its use (break-it finding: a
                // binary int4 was read as text here).
                let declared = &portal.statement.parameter_types;
                let typed = types.iter().enumerate().all(|(i, t)| {
                    t.is_some()
                        || declared
                            .get(i)
                            .is_some_and(|d| d.as_ref().is_some_and(|d| *d != Type::UNKNOWN))
                });
                if typed && matches!(guard::statement_kind(statement), Ok(Kind::Plan)) {
                    let style = TextStyle::of(client.metadata(), &login.session.ctx);
                    let run =
                        super::planned::run_planned(login, portal, statement, plan, &types, style);
                    return super::offload::off_worker(bounded(deadline, &token, run)).await;
                }
            }
            super::offload::off_worker(bounded(
                deadline,
                &token,
                ExtendedQueryHandler::do_query(&*login.session.service, client, portal, max_rows),
            ))
            .await
        });
        let mut r = super::params::guarded(work).await?;
        bound_rows(&mut r, deadline, &token);
        Ok(r)
    }
}
