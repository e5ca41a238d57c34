//! The connection's handlers: who may start (SCRAM, TLS required when configured), what a
//! statement may be (queries, INSERT, EXPLAIN and the control statements; no DDL or file
//! access over the wire), how it runs (inside the statement timeout and the client's cancel
//! request, rows collected before they are sent), and which SQLSTATE an error carries.
//!
//! datafusion-postgres brings the protocol glue (its `DfSessionService`, the PostgreSQL
//! dialect parser, `SET`/`SHOW`, transactions and cursors as hooks, Arrow to PostgreSQL type
//! encoding); these wrappers put Pulpitum's rules around it. A statement parsed once by the
//! extended protocol runs as a [`PreparedQuery`], cached per connection, so a driver's
//! latest-N page takes the prepared hot path.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{DFSchema, ParamValues, ScalarValue};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{EmptyRelation, LogicalPlan};
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::Statement;
use datafusion_postgres::arrow_pg::datatypes::df::deserialize_parameters;
use datafusion_postgres::arrow_pg::datatypes::{arrow_schema_to_pg_fields, encode_recordbatch};
use datafusion_postgres::hooks::HookClient;
use datafusion_postgres::pgwire::api::auth::noop::NoopStartupHandler;
use datafusion_postgres::pgwire::api::auth::sasl::scram::ScramAuth;
use datafusion_postgres::pgwire::api::auth::sasl::SASLAuthStartupHandler;
use datafusion_postgres::pgwire::api::auth::{DefaultServerParameterProvider, StartupHandler};
use datafusion_postgres::pgwire::api::cancel::{CancelHandler, DefaultCancelHandler};
use datafusion_postgres::pgwire::api::portal::{Format, Portal};
use datafusion_postgres::pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use datafusion_postgres::pgwire::api::results::{FieldInfo, QueryResponse, Response};
use datafusion_postgres::pgwire::api::store::PortalStore;
use datafusion_postgres::pgwire::api::{
    ClientInfo, ClientPortalStore, ConnectionManager, ErrorHandler, PgWireServerHandlers,
};
use datafusion_postgres::pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use datafusion_postgres::pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use datafusion_postgres::{DfSessionService, Parser, QueryHook};
use futures::{Sink, StreamExt};

use super::auth::{Users, SCRAM_ITERATIONS};
use crate::lru::Lru;
use crate::prepared::{prepare, PreparedError, PreparedQuery};

/// Statements kept prepared per connection (least recently used out).
const PREPARED_PER_CONNECTION: usize = 64;

/// The extended protocol's statement type, as datafusion-postgres parses it (kept, so its
/// cursor hook's downcast stays valid).
type DfStatement = (String, Option<(Statement, LogicalPlan)>);

fn error(severity: &str, code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        severity.into(),
        code.into(),
        message,
    )))
}

/// The SQLSTATE an error means, by what raised it: PostgreSQL's codes where one fits.
fn sqlstate(e: &(dyn std::error::Error + 'static)) -> &'static str {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(d) = err.downcast_ref::<DataFusionError>() {
            match d {
                DataFusionError::SQL(..) => return "42601",
                DataFusionError::ResourcesExhausted(_) => return "53000",
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
    } else if text.contains("kept conflicting after") || text.contains("could not serialize") {
        "40001"
    } else if text.contains("table '") && text.contains("' not found") {
        "42P01"
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

fn api(e: impl std::error::Error + Send + Sync + 'static) -> PgWireError {
    PgWireError::ApiError(Box::new(e))
}

/// A hook that refuses the statements its rule names, on every path (simple query, the
/// extended protocol's Parse and Execute), and lets every other statement pass on.
#[derive(Debug)]
pub(super) struct Refuse(pub(super) fn(&Statement) -> Option<PgWireError>);

#[async_trait]
impl QueryHook for Refuse {
    async fn handle_simple_query(
        &self,
        statement: &Statement,
        _ctx: &SessionContext,
        _client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        (self.0)(statement).map(Err)
    }

    async fn handle_extended_parse_query(
        &self,
        statement: &Statement,
        _ctx: &SessionContext,
        _client: &(dyn ClientInfo + Send + Sync),
    ) -> Option<PgWireResult<LogicalPlan>> {
        (self.0)(statement).map(Err)
    }

    async fn handle_extended_query(
        &self,
        statement: &Statement,
        _plan: &LogicalPlan,
        _params: &ParamValues,
        _ctx: &SessionContext,
        _client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        (self.0)(statement).map(Err)
    }
}

/// Refuses what may not run over the wire: everything but queries, INSERT and EXPLAIN of
/// them reaches this rule (SET/SHOW, transactions and cursors are answered by earlier hooks),
/// so DDL, COPY and file-backed tables (`CREATE EXTERNAL TABLE ... LOCATION '/etc/...'`) never
/// run for a remote client.
pub(super) fn refusal(s: &Statement) -> Option<PgWireError> {
    match s {
        Statement::Query(_) | Statement::Insert(_) => None,
        Statement::Explain { statement, .. } => refusal(statement),
        other => {
            let text = other.to_string();
            let head: String = text
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ");
            Some(error(
                "ERROR",
                "42501",
                format!(
                    "{head} ... is not allowed over the wire: queries, INSERT, EXPLAIN, SET, SHOW, \
                     transactions, ALTER TABLE ... SET/RESET (...) and SYSTEM STOP/START MOVES are; \
                     use the pulpitum shell for the rest"
                ),
            ))
        }
    }
}

/// Refuses `SET datafusion.*` and `RESET datafusion.*`: DataFusion's settings belong to the
/// session every connection shares, so one client could change how everyone's queries run.
/// PostgreSQL's own per-connection settings (`statement_timeout`, `TimeZone`, ...) pass on to
/// the `SET`/`SHOW` hook.
pub(super) fn shared_setting(s: &Statement) -> Option<PgWireError> {
    let text = s.to_string().to_ascii_lowercase();
    let words: Vec<&str> = text.split_whitespace().collect();
    let target = match words.as_slice() {
        ["set", "session" | "local", name, ..] | ["set", name, ..] | ["reset", name, ..] => *name,
        _ => return None,
    };
    target.starts_with("datafusion.").then(|| {
        error(
            "ERROR",
            "42501",
            format!(
                "{target} is a setting of the server's shared session and cannot be changed over \
                 the wire"
            ),
        )
    })
}

/// Lets a control statement through the extended protocol's Parse: its plan is an empty
/// relation with the answer's columns (the policy row); the statement runs at Execute.
#[derive(Debug)]
pub(super) struct ControlParse;

#[async_trait]
impl QueryHook for ControlParse {
    async fn handle_simple_query(
        &self,
        _statement: &Statement,
        _ctx: &SessionContext,
        _client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        None
    }

    async fn handle_extended_parse_query(
        &self,
        statement: &Statement,
        _ctx: &SessionContext,
        _client: &(dyn ClientInfo + Send + Sync),
    ) -> Option<PgWireResult<LogicalPlan>> {
        if !matches!(statement, Statement::AlterTable { .. }) {
            return None;
        }
        let schema = DFSchema::try_from(crate::control::policy_schema().as_ref().clone()).ok()?;
        Some(Ok(LogicalPlan::EmptyRelation(EmptyRelation {
            produce_one_row: false,
            schema: Arc::new(schema),
        })))
    }

    async fn handle_extended_query(
        &self,
        _statement: &Statement,
        _plan: &LogicalPlan,
        _params: &ParamValues,
        _ctx: &SessionContext,
        _client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        None
    }
}

/// Runs a statement inside the timeout; the client's cancel request drops this future (pgwire
/// selects it against the request), and since rows are collected inside, both stop the
/// work itself, not only its planning.
async fn guarded<T>(
    timeout: Option<Duration>,
    work: impl std::future::Future<Output = PgWireResult<T>>,
) -> PgWireResult<T> {
    match timeout {
        None => work.await,
        Some(t) => tokio::time::timeout(t, work).await.unwrap_or_else(|_| {
            Err(error(
                "ERROR",
                "57014",
                format!(
                    "canceling statement due to statement timeout ({} ms)",
                    t.as_millis()
                ),
            ))
        }),
    }
}

/// Where datafusion-postgres's `SET statement_timeout` keeps the connection's value (its
/// metadata key, in milliseconds).
const CLIENT_TIMEOUT_KEY: &str = "statement_timeout_ms";

/// The timeout of this connection's next statement: the server's, or the client's own
/// `SET statement_timeout` when that is shorter (a client may tighten, never loosen it).
fn effective_timeout(server: Option<Duration>, client: &impl ClientInfo) -> Option<Duration> {
    let own = client
        .metadata()
        .get(CLIENT_TIMEOUT_KEY)
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis);
    match (server, own) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Collects a query response's rows, so errors and the timeout apply to the whole result.
async fn collect_rows(r: &mut Response) -> PgWireResult<()> {
    if let Response::Query(q) = r {
        let mut rows = Vec::new();
        while let Some(row) = q.data_rows.next().await {
            rows.push(Ok(row?));
        }
        q.data_rows = Box::pin(futures::stream::iter(rows));
    }
    Ok(())
}

fn batches_response(
    batches: Vec<RecordBatch>,
    schema: &datafusion::arrow::datatypes::Schema,
    format: &Format,
) -> PgWireResult<Response> {
    let fields = Arc::new(arrow_schema_to_pg_fields(schema, format, None)?);
    Ok(rows_response(fields, batches))
}

/// Rows encoded for the client, with their fields.
fn rows_response(fields: Arc<Vec<FieldInfo>>, batches: Vec<RecordBatch>) -> Response {
    let mut rows = Vec::new();
    for b in batches {
        rows.extend(encode_recordbatch(fields.clone(), b));
    }
    Response::Query(QueryResponse::new(fields, futures::stream::iter(rows)))
}

/// The simple protocol: control statements first, then datafusion-postgres (hooks, then
/// DataFusion), rows collected inside the timeout.
pub(super) struct Simple {
    pub(super) inner: Arc<DfSessionService>,
    pub(super) ctx: Arc<SessionContext>,
    pub(super) timeout: Option<Duration>,
}

#[async_trait]
impl SimpleQueryHandler for Simple {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let timeout = effective_timeout(self.timeout, &*client);
        guarded(timeout, async {
            if let Some(batch) = crate::control::run_text(&self.ctx, query)
                .await
                .map_err(api)?
            {
                let schema = batch.schema();
                return Ok(vec![batches_response(
                    vec![batch],
                    &schema,
                    &Format::UnifiedText,
                )?]);
            }
            let mut out = SimpleQueryHandler::do_query(&*self.inner, client, query).await?;
            for r in &mut out {
                collect_rows(r).await?;
            }
            Ok(out)
        })
        .await
    }
}

/// A prepared query with its result columns as PostgreSQL fields, per result format (text
/// or binary: computed once, not per execution).
struct Prepared {
    query: Arc<PreparedQuery>,
    schema: datafusion::arrow::datatypes::SchemaRef,
    /// Text (0) and binary (1) results; per-column formats are computed each time.
    fields: Mutex<[Option<Arc<Vec<FieldInfo>>>; 2]>,
}

impl Prepared {
    fn fields(&self, format: &Format) -> PgWireResult<Arc<Vec<FieldInfo>>> {
        let slot = match format {
            Format::UnifiedText => 0,
            Format::UnifiedBinary => 1,
            Format::Individual(_) => {
                return Ok(Arc::new(arrow_schema_to_pg_fields(
                    &self.schema,
                    format,
                    None,
                )?))
            }
        };
        let mut known = self.fields.lock().expect("fields lock");
        if let Some(f) = &known[slot] {
            return Ok(f.clone());
        }
        let f = Arc::new(arrow_schema_to_pg_fields(&self.schema, format, None)?);
        known[slot] = Some(f.clone());
        Ok(f)
    }
}

/// The extended protocol, one per connection: a query parsed once runs as a prepared query
/// (cached by its text), anything else through datafusion-postgres.
pub(super) struct Extended {
    inner: Arc<DfSessionService>,
    ctx: Arc<SessionContext>,
    timeout: Option<Duration>,
    cache: Mutex<Lru<String, Option<Arc<Prepared>>>>,
}

impl Extended {
    fn new(
        inner: Arc<DfSessionService>,
        ctx: Arc<SessionContext>,
        timeout: Option<Duration>,
    ) -> Self {
        Self {
            inner,
            ctx,
            timeout,
            cache: Mutex::new(Lru::new(PREPARED_PER_CONNECTION)),
        }
    }

    /// The prepared query for `sql`, or `None` when it is not a query (an INSERT, a
    /// statement a hook answers): those go to datafusion-postgres every time.
    async fn prepared(&self, sql: &str) -> Option<Arc<Prepared>> {
        if let Some(hit) = self.cache.lock().expect("cache lock").get(sql) {
            return hit;
        }
        let p = match prepare(&self.ctx, sql).await {
            Ok(p) if p.is_query() => Some(Arc::new(Prepared {
                schema: p.schema(),
                query: Arc::new(p),
                fields: Mutex::new([None, None]),
            })),
            Ok(_) | Err(PreparedError::NotAQuery(_)) => None,
            // Anything else (a parse error of this planner, say) is left to the general path,
            // which reports it the way every other statement's error is reported.
            Err(_) => None,
        };
        self.cache
            .lock()
            .expect("cache lock")
            .insert(sql.to_string(), p.clone());
        p
    }
}

#[async_trait]
impl ExtendedQueryHandler for Extended {
    type Statement = DfStatement;
    type QueryParser = Parser;

    fn query_parser(&self) -> Arc<Parser> {
        self.inner.query_parser()
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
        let timeout = effective_timeout(self.timeout, &*client);
        guarded(timeout, async {
            let sql = portal.statement.statement.0.as_str();
            if let Some(batch) = crate::control::run_text(&self.ctx, sql)
                .await
                .map_err(api)?
            {
                let schema = batch.schema();
                return batches_response(vec![batch], &schema, &portal.result_column_format);
            }
            if let Some(p) = self.prepared(sql).await {
                let types: Vec<Option<&DataType>> =
                    p.query.parameter_types().iter().map(Some).collect();
                let values: Vec<ScalarValue> = match deserialize_parameters(portal, &types)? {
                    ParamValues::List(v) => v.into_iter().map(|s| s.value).collect(),
                    ParamValues::Map(_) => Vec::new(),
                };
                let batches = p.query.execute(&values).await.map_err(api)?;
                let fields = p.fields(&portal.result_column_format)?;
                return Ok(rows_response(fields, batches));
            }
            let mut r =
                ExtendedQueryHandler::do_query(&*self.inner, client, portal, max_rows).await?;
            collect_rows(&mut r).await?;
            Ok(r)
        })
        .await
    }
}

/// Startup without passwords (only on loopback, with `--insecure-no-auth`).
#[derive(Debug)]
pub(super) struct Open {
    conns: Arc<ConnectionManager>,
}

impl NoopStartupHandler for Open {
    fn connection_manager(&self) -> Option<Arc<ConnectionManager>> {
        Some(self.conns.clone())
    }
}

/// Startup: refuses plaintext when TLS is configured, then SCRAM (or nothing).
pub(super) enum Gate {
    Scram {
        inner: SASLAuthStartupHandler<DefaultServerParameterProvider>,
        tls_required: bool,
    },
    Open {
        inner: Open,
        tls_required: bool,
    },
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
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let tls_required = match self {
            Self::Scram { tls_required, .. } | Self::Open { tls_required, .. } => *tls_required,
        };
        if tls_required
            && !client.is_secure()
            && matches!(message, PgWireFrontendMessage::Startup(_))
        {
            return Err(error(
                "FATAL",
                "28000",
                "this server requires TLS: connect with sslmode=require".into(),
            ));
        }
        match self {
            Self::Scram { inner, .. } => inner.on_startup(client, message).await,
            Self::Open { inner, .. } => inner.on_startup(client, message).await,
        }
    }
}

/// Builds every connection's handlers.
pub(super) struct Factory {
    pub(super) simple: Arc<Simple>,
    pub(super) inner: Arc<DfSessionService>,
    pub(super) ctx: Arc<SessionContext>,
    pub(super) timeout: Option<Duration>,
    pub(super) users: Option<Arc<Users>>,
    pub(super) tls_required: bool,
    pub(super) conns: Arc<ConnectionManager>,
}

impl PgWireServerHandlers for Factory {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.simple.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        // Called once per connection: the prepared-statement cache is the connection's.
        Arc::new(Extended::new(
            self.inner.clone(),
            self.ctx.clone(),
            self.timeout,
        ))
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        // Called once per connection: SCRAM keeps its exchange's state in the handler.
        Arc::new(match &self.users {
            Some(users) => {
                let mut scram = ScramAuth::new(users.clone());
                scram.set_iterations(SCRAM_ITERATIONS);
                Gate::Scram {
                    inner: SASLAuthStartupHandler::new(Arc::new(
                        DefaultServerParameterProvider::default(),
                    ))
                    .with_scram(scram)
                    .with_connection_manager(self.conns.clone()),
                    tls_required: self.tls_required,
                }
            }
            None => Gate::Open {
                inner: Open {
                    conns: self.conns.clone(),
                },
                tls_required: self.tls_required,
            },
        })
    }

    fn error_handler(&self) -> Arc<impl ErrorHandler> {
        Arc::new(SqlStates)
    }

    fn cancel_handler(&self) -> Arc<impl CancelHandler> {
        Arc::new(DefaultCancelHandler::new(self.conns.clone()))
    }
}
