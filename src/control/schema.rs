//! Declared tables from SQL: `CREATE EXTERNAL TABLE ... STORED AS PULPITUM` with a column
//! list of the user's own and a `partition_by` option, and `ALTER TABLE` column changes.
//!
//! Both are recognized here rather than planned by DataFusion: its planner knows no `JSON`
//! type and no `ALTER TABLE`. The column list is read from the SQL types as written
//! ([`ColumnType`]'s spellings), so a `JSON` column stays JSON and a `TIMESTAMPTZ` keeps its
//! zone. A `DEFAULT` must be a constant: a literal, optionally signed or cast, read as the
//! column's type by Arrow's cast (text to timestamp, date, numeric), never evaluated as an
//! expression.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringArray};
use datafusion::arrow::compute::{cast_with_options, CastOptions};
use datafusion::arrow::datatypes::{
    Date32Type, Decimal128Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type,
    TimestampMicrosecondType,
};
use datafusion::sql::parser::{DFParser, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{
    AlterColumnOperation, AlterTableOperation, ColumnDef, ColumnOption, Expr, Statement,
    UnaryOperator, Value as SqlValue,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;

use super::ControlError;
use crate::model::schema::{
    ColumnType, KeyColumn, KeyType, SchemaChange, SchemaError, TableSchema, Value,
    DECLARED_RECORD_SCHEMA_VERSION, SCHEMA_FORMAT,
};
use crate::model::{BucketStrategy, TableId};
use crate::store::{HotStore, StoreError, StoredSchema, TableDefinition};

/// The surface name of declared tables in the registry.
pub const DECLARED: &str = "declared";

/// The options a declared table takes.
const OPTIONS: &str = "partition_by, time, order_by, bucket_strategy, writable_buckets";

/// A `CREATE EXTERNAL TABLE` of a declared table.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateDeclared {
    /// The registration.
    pub definition: TableDefinition,
    /// Version 1 of its schema.
    pub schema: TableSchema,
    /// `IF NOT EXISTS`: an existing declared table of that name is kept as it is.
    pub if_not_exists: bool,
}

fn syntax(detail: impl Into<String>) -> ControlError {
    ControlError::Syntax {
        detail: detail.into(),
    }
}

impl From<SchemaError> for ControlError {
    fn from(e: SchemaError) -> Self {
        ControlError::Schema(e)
    }
}

fn name_of(ident: &datafusion::sql::sqlparser::ast::Ident) -> String {
    // Unquoted names fold to lower case, as PostgreSQL does; quoted ones are kept (and
    // then refused unless they are already lower case).
    match ident.quote_style {
        None => ident.value.to_ascii_lowercase(),
        Some(_) => ident.value.clone(),
    }
}

fn column_type(
    column: &str,
    t: &datafusion::sql::sqlparser::ast::DataType,
) -> Result<ColumnType, ControlError> {
    t.to_string().parse().map_err(|e: String| {
        ControlError::Schema(SchemaError::Type {
            column: column.to_string(),
            reason: format!(
                "{e}; the types are BOOLEAN, SMALLINT, INTEGER, BIGINT, REAL, DOUBLE PRECISION, \
                 NUMERIC(p, s), TEXT, BYTEA, TIMESTAMPTZ, DATE and JSON"
            ),
        })
    })
}

/// `CREATE EXTERNAL TABLE` of a declared table, if `sql` is one: `STORED AS PULPITUM` with a
/// `partition_by` option. Any other `CREATE EXTERNAL TABLE` is `Ok(None)` (DataFusion's).
pub fn parse_create(sql: &str) -> Result<Option<CreateDeclared>, ControlError> {
    let Ok(mut stmts) = DFParser::parse_sql_with_dialect(sql, &PostgreSqlDialect {}) else {
        return Ok(None);
    };
    if stmts.len() != 1 {
        return Ok(None);
    }
    let Some(DFStatement::CreateExternalTable(c)) = stmts.pop_front() else {
        return Ok(None);
    };
    if !c.file_type.eq_ignore_ascii_case("pulpitum") {
        return Ok(None);
    }
    let option = |key: &str| {
        c.options.iter().find_map(|(k, v)| {
            let k = k.strip_prefix("format.").unwrap_or(k);
            (k.eq_ignore_ascii_case(key)).then(|| match v {
                SqlValue::SingleQuotedString(s) | SqlValue::DoubleQuotedString(s) => s.clone(),
                other => other.to_string(),
            })
        })
    };
    let Some(partition_by) = option("partition_by") else {
        return Ok(None);
    };
    for (k, _) in &c.options {
        let k = k.strip_prefix("format.").unwrap_or(k).to_ascii_lowercase();
        if !OPTIONS.split(", ").any(|o| o == k) {
            return Err(syntax(format!(
                "unknown option {k:?} for a declared table (expected {OPTIONS})"
            )));
        }
    }
    let table_id = TableId::new(name_of(
        c.name
            .0
            .last()
            .and_then(|p| p.as_ident())
            .ok_or_else(|| syntax("a table name"))?,
    ))
    .map_err(|e| syntax(e.to_string()))?;
    if crate::provider::factory::RESERVED_TABLE_NAMES.contains(&table_id.as_str()) {
        return Err(syntax(format!(
            "{table_id} is the name of a system table; choose another name"
        )));
    }
    if !c.locations.iter().all(|l| l.is_empty())
        || !c.table_partition_cols.is_empty()
        || !c.order_exprs.is_empty()
        || c.or_replace
        || c.temporary
        || c.unbounded
        || !c.constraints.is_empty()
    {
        return Err(syntax(
            "a declared table takes LOCATION '' and OPTIONS only (no PARTITIONED BY, WITH \
             ORDER, OR REPLACE, TEMPORARY, UNBOUNDED or constraints; its keys are the \
             partition_by, time and order_by options)",
        ));
    }
    let time =
        option("time").ok_or_else(|| syntax("a declared table needs OPTIONS ('time' 'column')"))?;
    let order_by = option("order_by")
        .ok_or_else(|| syntax("a declared table needs OPTIONS ('order_by' 'column')"))?;
    let strategy: BucketStrategy = match option("bucket_strategy") {
        Some(s) => s
            .parse()
            .map_err(|e: crate::model::ModelError| syntax(e.to_string()))?,
        None => BucketStrategy::default(),
    };
    let writable = match option("writable_buckets") {
        Some(v) => Some(v.parse::<u32>().ok().filter(|n| *n > 0).ok_or_else(|| {
            syntax(format!(
                "writable_buckets must be a positive integer, got {v:?}"
            ))
        })?),
        None => None,
    };
    let (partition_by, time, order_by) = (
        partition_by.to_ascii_lowercase(),
        time.to_ascii_lowercase(),
        order_by.to_ascii_lowercase(),
    );
    if c.columns.is_empty() {
        return Err(syntax("a declared table needs its column list"));
    }
    let mut partition = None;
    let mut sort = None;
    let mut time_seen = false;
    let mut values = Vec::new();
    for col in &c.columns {
        let name = name_of(&col.name);
        let (nullable, default) = column_options(&name, col)?;
        let ty = column_type(&name, &col.data_type)?;
        let key_role = if name == partition_by {
            Some("partition_by")
        } else if name == order_by {
            Some("order_by")
        } else if name == time {
            Some("time")
        } else {
            None
        };
        if let Some(role) = key_role {
            if default.is_some() {
                return Err(ControlError::Schema(SchemaError::Type {
                    column: name,
                    reason: format!("a key column ({role}) takes no DEFAULT"),
                }));
            }
        }
        match key_role {
            Some("time") => {
                if ty != ColumnType::TimestampTz {
                    return Err(ControlError::Schema(SchemaError::Type {
                        column: name,
                        reason: format!("the time column must be TIMESTAMPTZ, not {ty}"),
                    }));
                }
                time_seen = true;
            }
            Some(role) => {
                let kt = KeyType::of(ty).ok_or_else(|| {
                    ControlError::Schema(SchemaError::Type {
                        column: name.clone(),
                        reason: format!(
                            "a key column ({role}) must be SMALLINT, INTEGER, BIGINT, TEXT or \
                             BYTEA, not {ty}"
                        ),
                    })
                })?;
                let key = KeyColumn {
                    name: name.clone(),
                    ty: kt,
                };
                if role == "partition_by" {
                    partition = Some(key);
                } else {
                    sort = Some(key);
                }
            }
            None => values.push((name, ty, nullable, default)),
        }
    }
    let missing = |opt: &str, col: &str| {
        syntax(format!(
            "option {opt} names {col}, which is not in the column list"
        ))
    };
    let partition = partition.ok_or_else(|| missing("partition_by", &partition_by))?;
    let sort = sort.ok_or_else(|| missing("order_by", &order_by))?;
    if !time_seen {
        return Err(missing("time", &time));
    }
    if partition_by == order_by || partition_by == time || order_by == time {
        return Err(syntax(
            "partition_by, time and order_by must name three different columns",
        ));
    }
    // Keys come first in the table's SQL order, whatever order the list gave them in.
    let schema = TableSchema::new(partition, time, sort, values)?;
    let mut definition = TableDefinition::new(table_id, strategy, DECLARED);
    definition.writable_buckets = writable;
    definition.record_schema_version = DECLARED_RECORD_SCHEMA_VERSION as i32;
    Ok(Some(CreateDeclared {
        definition,
        schema,
        if_not_exists: c.if_not_exists,
    }))
}

/// A column's `NULL`/`NOT NULL` and `DEFAULT`.
fn column_options(name: &str, col: &ColumnDef) -> Result<(bool, Option<Value>), ControlError> {
    let ty = column_type(name, &col.data_type)?;
    let mut nullable = true;
    let mut default = None;
    for o in &col.options {
        match &o.option {
            ColumnOption::NotNull => nullable = false,
            ColumnOption::Null => nullable = true,
            ColumnOption::Default(e) => default = Some(constant(name, e, ty)?),
            other => {
                return Err(ControlError::Schema(SchemaError::Column {
                    column: name.to_string(),
                    reason: format!(
                        "{other} is not supported (a column takes NULL, NOT NULL and DEFAULT)"
                    ),
                }))
            }
        }
    }
    Ok((nullable, default))
}

/// A `DEFAULT` constant as a value of `ty`.
pub fn constant(column: &str, e: &Expr, ty: ColumnType) -> Result<Value, ControlError> {
    let bad = |why: &str| {
        ControlError::Schema(SchemaError::Type {
            column: column.to_string(),
            reason: format!("DEFAULT {e}: {why}"),
        })
    };
    // The literal's text, with its sign.
    fn text(e: &Expr) -> Option<(String, bool)> {
        match e {
            Expr::Value(v) => match &v.value {
                SqlValue::Null => None,
                SqlValue::Number(n, _) => Some((n.clone(), true)),
                SqlValue::SingleQuotedString(s) => Some((s.clone(), false)),
                SqlValue::Boolean(b) => Some((b.to_string(), false)),
                _ => None,
            },
            Expr::UnaryOp {
                op: UnaryOperator::Minus,
                expr,
            } => match text(expr)? {
                (n, true) => Some((format!("-{n}"), true)),
                _ => None,
            },
            Expr::Nested(inner) => text(inner),
            Expr::Cast { expr, .. } => text(expr),
            Expr::TypedString(t) => match &t.value.value {
                SqlValue::SingleQuotedString(s) => Some((s.clone(), false)),
                _ => None,
            },
            _ => None,
        }
    }
    if let Expr::Value(v) = e {
        if v.value == SqlValue::Null {
            return Ok(Value::Null);
        }
    }
    // A cast is taken as naming the column's own type; a cast to another type would change
    // the value (PostgreSQL's `1.9::integer` is 2), which a constant read as text cannot do.
    let mut inner = e;
    loop {
        match inner {
            Expr::Cast {
                expr, data_type, ..
            } => {
                if data_type.to_string().parse::<ColumnType>().ok() != Some(ty) {
                    return Err(bad(&format!(
                        "a cast to {data_type} in a DEFAULT of a {ty} column is not supported; \
                         write the constant as a {ty}"
                    )));
                }
                inner = expr;
            }
            Expr::Nested(x) => inner = x,
            _ => break,
        }
    }
    let (s, _) = text(e).ok_or_else(|| {
        bad("a DEFAULT must be a constant (a literal, optionally signed or cast)")
    })?;
    if ty == ColumnType::Bytea {
        return match s.strip_prefix("\\x") {
            Some(h) => hex::decode(h).map(Value::Bytes).map_err(|_| bad("bad hex")),
            None => Ok(Value::Bytes(s.into_bytes())),
        };
    }
    if matches!(ty, ColumnType::Text) {
        return Ok(Value::Text(s));
    }
    if ty == ColumnType::Json {
        serde_json::from_str::<serde_json::Value>(&s).map_err(|_| bad("not valid JSON"))?;
        return Ok(Value::Text(s));
    }
    let a: ArrayRef = Arc::new(StringArray::from(vec![s.as_str()]));
    let opts = CastOptions {
        safe: false,
        ..Default::default()
    };
    let c =
        cast_with_options(&a, &ty.arrow(), &opts).map_err(|x| bad(&format!("not a {ty} ({x})")))?;
    if c.is_null(0) {
        return Err(bad(&format!("not a {ty}")));
    }
    let v = match ty {
        ColumnType::Boolean => Value::Boolean(c.as_boolean().value(0)),
        ColumnType::Int16 => Value::Int(c.as_primitive::<Int16Type>().value(0).into()),
        ColumnType::Int32 => Value::Int(c.as_primitive::<Int32Type>().value(0).into()),
        ColumnType::Int64 => Value::Int(c.as_primitive::<Int64Type>().value(0)),
        ColumnType::Float32 => Value::Float(c.as_primitive::<Float32Type>().value(0).into()),
        ColumnType::Float64 => Value::Float(c.as_primitive::<Float64Type>().value(0)),
        ColumnType::Decimal { .. } => {
            Value::Decimal(c.as_primitive::<Decimal128Type>().value(0).to_string())
        }
        ColumnType::TimestampTz => {
            Value::TimestampMicros(c.as_primitive::<TimestampMicrosecondType>().value(0))
        }
        ColumnType::Date => Value::Date(c.as_primitive::<Date32Type>().value(0)),
        ColumnType::Text | ColumnType::Json | ColumnType::Bytea => unreachable!("handled above"),
    };
    Ok(v)
}

/// One column change of an `ALTER TABLE`, as parsed.
#[derive(Debug, Clone, PartialEq)]
pub enum AlterOp {
    /// A change whose values are known.
    Change(SchemaChange),
    /// `ALTER COLUMN name SET DEFAULT expr`: the constant is read as the column's type when
    /// the change is applied to the schema.
    SetDefault {
        /// The column.
        name: String,
        /// The constant as written.
        expr: Box<Expr>,
    },
}

impl std::fmt::Display for AlterOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Change(c) => c.fmt(f),
            Self::SetDefault { name, .. } => write!(f, "change the default of column {name}"),
        }
    }
}

/// `ALTER TABLE name` column changes, if `sql` is one: `ADD [COLUMN]`, `DROP [COLUMN]`,
/// `RENAME [COLUMN] a TO b`, `ALTER [COLUMN] c TYPE t | DROP NOT NULL | SET DEFAULT k |
/// DROP DEFAULT`, several separated by commas (applied in order, as one schema version
/// each). Any other `ALTER TABLE` is refused with the forms it takes.
pub fn parse_alter(sql: &str) -> Result<Option<(TableId, Vec<AlterOp>)>, ControlError> {
    let stmts = Parser::parse_sql(&PostgreSqlDialect {}, sql)
        .map_err(|e| syntax(format!("ALTER TABLE: {e}")))?;
    let [Statement::AlterTable(alter)] = stmts.as_slice() else {
        return Ok(None);
    };
    let table = TableId::new(name_of(
        alter
            .name
            .0
            .last()
            .and_then(|p| p.as_ident())
            .ok_or_else(|| syntax("a table name"))?,
    ))
    .map_err(|e| syntax(e.to_string()))?;
    let mut changes = Vec::new();
    for op in &alter.operations {
        match op {
            AlterTableOperation::AddColumn {
                if_not_exists: false,
                column_def,
                column_position: None,
                ..
            } => {
                let name = name_of(&column_def.name);
                let ty = column_type(&name, &column_def.data_type)?;
                let (nullable, default) = column_options(&name, column_def)?;
                changes.push(AlterOp::Change(SchemaChange::AddColumn {
                    name,
                    ty,
                    nullable,
                    default,
                }));
            }
            AlterTableOperation::DropColumn {
                column_names,
                if_exists: false,
                drop_behavior: None,
                ..
            } => {
                for c in column_names {
                    changes.push(AlterOp::Change(SchemaChange::DropColumn {
                        name: name_of(c),
                    }));
                }
            }
            AlterTableOperation::RenameColumn {
                old_column_name,
                new_column_name,
            } => changes.push(AlterOp::Change(SchemaChange::RenameColumn {
                from: name_of(old_column_name),
                to: name_of(new_column_name),
            })),
            AlterTableOperation::AlterColumn { column_name, op } => {
                let name = name_of(column_name);
                changes.push(AlterOp::Change(match op {
                    AlterColumnOperation::SetDataType {
                        data_type,
                        using: None,
                        ..
                    } => SchemaChange::SetType {
                        ty: column_type(&name, data_type)?,
                        name,
                    },
                    AlterColumnOperation::DropNotNull => SchemaChange::DropNotNull { name },
                    AlterColumnOperation::DropDefault => SchemaChange::SetDefault {
                        name,
                        default: None,
                    },
                    AlterColumnOperation::SetDefault { value } => {
                        // Read as the column's type, known only against the schema.
                        changes.push(AlterOp::SetDefault {
                            name,
                            expr: Box::new(value.clone()),
                        });
                        continue;
                    }
                    other => {
                        return Err(syntax(format!(
                            "ALTER COLUMN {name} {other} is not supported (TYPE, DROP NOT NULL, \
                             SET DEFAULT and DROP DEFAULT are)"
                        )))
                    }
                }));
            }
            other => {
                return Err(syntax(format!(
                    "ALTER TABLE {table} {other} is not supported; a declared table takes ADD \
                     COLUMN, DROP COLUMN, RENAME COLUMN and ALTER COLUMN (TYPE, DROP NOT NULL, \
                     SET DEFAULT, DROP DEFAULT), and every table SET (...) and RESET (...)"
                )))
            }
        }
    }
    Ok(Some((table, changes)))
}

/// Registers a declared table and its first schema version: the identical definition again
/// is a no-op; a table of that name with another definition is refused, naming it.
pub async fn create(store: &dyn HotStore, c: &CreateDeclared) -> Result<u32, ControlError> {
    let id = &c.definition.table_id;
    // Only a new table stores anything: the same CREATE again (a start-up script) is
    // answered below whatever runs.
    if store.table(id).await?.is_none() {
        super::readers::require_readers(
            store,
            &format!("CREATE EXTERNAL TABLE {id}"),
            DECLARED_RECORD_SCHEMA_VERSION,
            SCHEMA_FORMAT,
        )
        .await?;
    }
    match store.register_table(&c.definition).await {
        Ok(_) => {}
        Err(StoreError::TableConflict { existing, .. }) => {
            return Err(ControlError::Schema(SchemaError::Refused {
                change: format!("create table {id}"),
                reason: format!("a table of that name exists ({existing}); choose another name"),
            }))
        }
        Err(e) => return Err(e.into()),
    };
    match store.table_schema(id).await? {
        None => {
            store
                .put_table_schema(
                    id,
                    &StoredSchema {
                        version: 1,
                        definition: c.schema.to_checked_json()?,
                    },
                )
                .await?;
            Ok(1)
        }
        Some(s) => {
            let current = TableSchema::from_json(&s.definition)?;
            // The identical first version again, or any declared table under IF NOT EXISTS
            // (a start-up script's CREATE after ALTERs), is a no-op, as in PostgreSQL.
            if (current.version == 1 && current == c.schema) || c.if_not_exists {
                return Ok(current.version);
            }
            Err(ControlError::Schema(SchemaError::Refused {
                change: format!("create table {id}"),
                reason: format!(
                    "it exists with another schema (version {}); change it with ALTER TABLE",
                    current.version
                ),
            }))
        }
    }
}

/// Applies column changes to a declared table, one schema version each, and returns the
/// newest version. Each version is stored only if it follows the one it was made from, so a
/// concurrent change makes this one fail with nothing of it stored past that point.
pub async fn alter(
    store: &dyn HotStore,
    table: &TableId,
    changes: &[AlterOp],
) -> Result<u32, ControlError> {
    let def = store
        .table(table)
        .await?
        .ok_or_else(|| ControlError::Store(StoreError::UnknownTable(table.clone())))?;
    if def.surface != DECLARED {
        return Err(ControlError::Schema(SchemaError::Refused {
            change: changes.first().map_or_else(String::new, |c| c.to_string()),
            reason: format!(
                "table {table} has the fixed {} surface; only declared tables (CREATE \
                 EXTERNAL TABLE with a column list and partition_by) change their columns",
                def.surface
            ),
        }));
    }
    // The table's rows keep their record schema; what is stored is a schema version in
    // this build's format.
    super::readers::require_readers(store, &format!("ALTER TABLE {table}"), 0, SCHEMA_FORMAT)
        .await?;
    let stored = store.table_schema(table).await?.ok_or_else(|| {
        ControlError::Schema(SchemaError::Stored(format!(
            "declared table {table} has no stored schema; run its CREATE EXTERNAL TABLE again"
        )))
    })?;
    let mut schema = TableSchema::from_json(&stored.definition)?;
    // Validate every change before storing any.
    let mut versions = Vec::new();
    for change in changes {
        let change = resolve_default(&schema, change)?;
        schema = schema.apply(&change)?;
        versions.push(schema.clone());
    }
    for v in &versions {
        store
            .put_table_schema(
                table,
                &StoredSchema {
                    version: v.version,
                    definition: v.to_checked_json()?,
                },
            )
            .await?;
    }
    Ok(schema.version)
}

/// An `ALTER TABLE` change with its constant read as the column's type.
fn resolve_default(schema: &TableSchema, op: &AlterOp) -> Result<SchemaChange, ControlError> {
    match op {
        AlterOp::Change(c) => Ok(c.clone()),
        AlterOp::SetDefault { name, expr } => {
            let col = schema.column(name).ok_or_else(|| {
                ControlError::Schema(SchemaError::Column {
                    column: name.clone(),
                    reason: "no such column".into(),
                })
            })?;
            Ok(SchemaChange::SetDefault {
                name: name.clone(),
                default: Some(constant(name, expr, col.ty)?),
            })
        }
    }
}
