//! The control plane from SQL: tiering policies, pauses and the system tables that show the
//! tiering queue and its history, in every session, on both hot stores.
//!
//! - [`statements`] recognizes `ALTER TABLE ... SET/RESET (...)` and `SYSTEM STOP/START
//!   MOVES`, which DataFusion cannot plan, and [`run`] applies them to the store.
//! - [`options`] parses and prints the policy options (`archive_after = '90 days'`).
//! - [`queue`] is the rule behind `pulpitum_buckets.eligible` and `reason`, and the queue
//!   view of the shell's `\buckets`.
//! - [`system`] is the system tables, `pulpitum_tables`, `pulpitum_buckets`,
//!   `pulpitum_jobs`, `pulpitum_compactions` and `pulpitum_retired_objects`: table
//!   providers over the store's catalog, listings, job history and compaction registry,
//!   with the filters an operator writes (table, state, time) pushed into the store's query.
//!
//! [`sql`] is the one entry for a statement's text that every front end uses (the REPL, the
//! embedded API, a wire server): a control statement runs here; anything else is planned by
//! DataFusion, checked, and executed. The store reaches a session through its configuration
//! ([`ControlHandle`]), so a plain `SessionContext` built by [`crate::session`] carries it.

pub mod options;
pub mod queue;
pub mod readers;
pub mod schema;
pub mod statements;
pub mod system;

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray, StringArray, TimestampMicrosecondArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::DataFusionError;
use datafusion::prelude::{DataFrame, SessionContext};

use crate::store::{HotStore, StoreError, TablePolicy};

pub use statements::{recognize, ControlStatement};

/// Every way a control statement can fail.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The statement started like a control statement and broke off.
    #[error("invalid control statement: {detail}")]
    Syntax {
        /// What was expected and found.
        detail: String,
    },
    /// An option that tables do not have.
    #[error("unknown table option {option:?}; the options are archive_after, format, cleanup_delay, paused")]
    UnknownOption {
        /// As written.
        option: String,
    },
    /// An option named twice in one statement.
    #[error("table option {option} is given more than once")]
    RepeatedOption {
        /// The option.
        option: String,
    },
    /// A value the option does not accept.
    #[error("table option {option}: {value:?} {reason}")]
    BadOption {
        /// The option.
        option: String,
        /// As written.
        value: String,
        /// What it accepts.
        reason: String,
    },
    /// A declared table's schema, or a change to it, refused.
    #[error(transparent)]
    Schema(crate::model::schema::SchemaError),
    /// A running process reads less than the statement would store.
    #[error(transparent)]
    Readers(#[from] readers::ReaderError),
    /// The session was not built over a Pulpitum store.
    #[error("this session has no Pulpitum store; build it with pulpitum::session")]
    NoStore,
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Building the answer failed.
    #[error(transparent)]
    Arrow(#[from] datafusion::arrow::error::ArrowError),
}

impl From<ControlError> for DataFusionError {
    fn from(e: ControlError) -> Self {
        match e {
            ControlError::Syntax { .. }
            | ControlError::UnknownOption { .. }
            | ControlError::RepeatedOption { .. }
            | ControlError::BadOption { .. }
            | ControlError::Schema(_) => DataFusionError::Plan(e.to_string()),
            other => DataFusionError::External(Box::new(other)),
        }
    }
}

/// The store a session's control statements and system tables use, kept in the session's
/// configuration.
#[derive(Clone)]
pub struct ControlHandle {
    /// The hot store.
    pub store: Arc<dyn HotStore>,
}

impl std::fmt::Debug for ControlHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ControlHandle")
    }
}

fn handle(ctx: &SessionContext) -> Option<Arc<ControlHandle>> {
    ctx.state().config().get_extension::<ControlHandle>()
}

/// Runs one statement's text: a control statement against the store, anything else through
/// DataFusion (planned, checked by [`crate::provider::factory::check_statement`], then
/// executed). The answer is a `DataFrame` either way.
pub async fn sql(ctx: &SessionContext, text: &str) -> Result<DataFrame, DataFusionError> {
    if let Some(batch) = run_text(ctx, text).await? {
        return ctx.read_batch(batch);
    }
    let plan = crate::provider::defaults::plan_text(ctx, &ctx.state(), text).await?;
    crate::provider::factory::check_statement(ctx, &plan).await?;
    ctx.execute_logical_plan(plan).await
}

/// Runs `text` if it is a control statement (against the session's store) and returns its
/// answer; `Ok(None)` when it is not one.
pub async fn run_text(
    ctx: &SessionContext,
    text: &str,
) -> Result<Option<RecordBatch>, ControlError> {
    let Some(stmt) = recognize(text)? else {
        return Ok(None);
    };
    let store = handle(ctx).ok_or(ControlError::NoStore)?.store.clone();
    Ok(Some(run_in(ctx, &*store, &stmt).await?))
}

/// [`run`], then, after a declared table's creation or change, makes the session's next
/// statement see the table's newest schema (rather than after its recheck interval).
pub async fn run_in(
    ctx: &SessionContext,
    store: &dyn HotStore,
    stmt: &ControlStatement,
) -> Result<RecordBatch, ControlError> {
    let out = run(store, stmt).await?;
    let changed = match stmt {
        ControlStatement::CreateDeclared(c) => Some(&c.definition.table_id),
        ControlStatement::AlterColumns { table, .. } => Some(table),
        _ => None,
    };
    if let Some(t) = changed {
        crate::provider::factory::forget_table(ctx, t.as_str());
    }
    Ok(out)
}

/// Applies a control statement; answers with the table's policy after it (or, for the whole
/// store, the pause).
pub async fn run(
    store: &dyn HotStore,
    stmt: &ControlStatement,
) -> Result<RecordBatch, ControlError> {
    match stmt {
        ControlStatement::Set { table, options } => {
            let update = options::set_options(options)?;
            Ok(policy_batch(&store.update_policy(table, &update).await?)?)
        }
        ControlStatement::Reset { table, options } => {
            let update = options::reset_options(options)?;
            Ok(policy_batch(&store.update_policy(table, &update).await?)?)
        }
        ControlStatement::Moves {
            table: Some(table),
            paused,
        } => {
            let update = crate::store::PolicyUpdate {
                paused: Some(*paused),
                ..Default::default()
            };
            Ok(policy_batch(&store.update_policy(table, &update).await?)?)
        }
        ControlStatement::CreateDeclared(c) => {
            let v = schema::create(store, c).await?;
            Ok(schema_batch(&c.definition.table_id, v)?)
        }
        ControlStatement::AlterColumns { table, changes } => {
            let v = schema::alter(store, table, changes).await?;
            Ok(schema_batch(table, v)?)
        }
        ControlStatement::Moves {
            table: None,
            paused,
        } => {
            store.set_store_paused(*paused).await?;
            Ok(RecordBatch::try_new(
                answer_schema(stmt),
                vec![Arc::new(BooleanArray::from(vec![*paused])) as ArrayRef],
            )?)
        }
    }
}

/// The columns of a control statement's answer: the table's policy, or for the whole store
/// its pause (what a client's Describe needs before the statement runs).
pub fn answer_schema(stmt: &ControlStatement) -> datafusion::arrow::datatypes::SchemaRef {
    match stmt {
        ControlStatement::Moves { table: None, .. } => Arc::new(Schema::new(vec![Field::new(
            "store_paused",
            DataType::Boolean,
            false,
        )])),
        ControlStatement::CreateDeclared(_) | ControlStatement::AlterColumns { .. } => {
            Arc::new(Schema::new(vec![
                Field::new("table_id", DataType::Utf8, false),
                Field::new("schema_version", DataType::Int64, false),
            ]))
        }
        _ => policy_schema(),
    }
}

/// The answer of a declared table's creation or change: the table and its schema version.
fn schema_batch(
    table: &crate::model::TableId,
    version: u32,
) -> Result<RecordBatch, datafusion::arrow::error::ArrowError> {
    let stmt = ControlStatement::AlterColumns {
        table: table.clone(),
        changes: Vec::new(),
    };
    RecordBatch::try_new(
        answer_schema(&stmt),
        vec![
            Arc::new(StringArray::from(vec![table.as_str()])) as ArrayRef,
            Arc::new(datafusion::arrow::array::Int64Array::from(vec![i64::from(
                version,
            )])),
        ],
    )
}

/// The columns of a policy answer (what `ALTER TABLE ... SET` returns).
pub fn policy_schema() -> datafusion::arrow::datatypes::SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("table_id", DataType::Utf8, false),
        Field::new("archive_after", DataType::Utf8, true),
        Field::new("format", DataType::Utf8, true),
        Field::new("cleanup_delay", DataType::Utf8, true),
        Field::new("retain_for", DataType::Utf8, true),
        Field::new("paused", DataType::Boolean, false),
        Field::new(
            "updated_at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
    ]))
}

/// One policy as a one-row answer: the table and each option as it now stands.
pub fn policy_batch(p: &TablePolicy) -> Result<RecordBatch, datafusion::arrow::error::ArrowError> {
    let text = |v: Option<String>| Arc::new(StringArray::from(vec![v])) as ArrayRef;
    RecordBatch::try_new(
        policy_schema(),
        vec![
            text(Some(p.table_id.to_string())),
            text(p.archive_after.map(options::format_duration)),
            text(p.format.clone()),
            text(p.cleanup_delay.map(options::format_duration)),
            text(p.retain_for.map(options::format_retention)),
            Arc::new(BooleanArray::from(vec![p.paused])),
            Arc::new(
                TimestampMicrosecondArray::from(vec![p.updated_at.map(|t| t.as_micros())])
                    .with_timezone("UTC"),
            ),
        ],
    )
}
