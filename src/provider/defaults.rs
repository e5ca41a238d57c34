//! `DEFAULT` as a value in the rows of `INSERT ... VALUES`.
//!
//! PostgreSQL lets a row ask for a column's default with the keyword `DEFAULT` in place of a
//! value. DataFusion's planner reads the bare word as a reference to a column named
//! `default` (and fails), and fills defaults only for the columns an `INSERT` leaves out of
//! its column list. So, before planning, a statement whose rows say `DEFAULT` is rewritten
//! to leave those columns out, and the planner fills them exactly as for a column never
//! named: the same default value, the same cast, NULL where the column has none (which a
//! `NOT NULL` column then refuses, as PostgreSQL does).
//!
//! That works only when every row says `DEFAULT` in the same columns. Rows that differ are
//! refused with a message saying so, rather than split into several statements: one
//! `INSERT` is one write, committed or refused whole. So is a `DEFAULT` inside an
//! expression, which PostgreSQL refuses too. Only the unquoted word counts, and only as a
//! whole value of a `VALUES` row of an `INSERT`, where no column is in scope: a quoted
//! `"default"` is left to the planner.
//!
//! Every path that plans SQL text or a parsed statement for a session goes through here:
//! [`crate::control::sql`] (the shell and embedded applications), the wire server's simple
//! and extended protocols, and [`crate::prepared`].

use datafusion::common::{plan_err, DataFusionError, Result, TableReference};
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    Expr, Ident, Insert, ObjectName, ObjectNamePart, SetExpr, Statement, TableObject,
};

/// Plans one statement's text in `state` (with `ctx`'s tables), `DEFAULT` values included.
pub async fn plan_text(
    ctx: &SessionContext,
    state: &SessionState,
    sql: &str,
) -> Result<LogicalPlan> {
    let dialect = state.config().options().sql_parser.dialect;
    let mut statement = state.sql_to_statement(sql, &dialect)?;
    if let DFStatement::Statement(s) = &mut statement {
        fill(ctx, s).await?;
    }
    state.statement_to_plan(statement).await
}

/// Plans a parsed statement in `state` (with `ctx`'s tables), `DEFAULT` values included.
pub async fn plan_statement(
    ctx: &SessionContext,
    state: &SessionState,
    statement: &Statement,
) -> Result<LogicalPlan> {
    let mut statement = statement.clone();
    fill(ctx, &mut statement).await?;
    state
        .statement_to_plan(DFStatement::Statement(Box::new(statement)))
        .await
}

/// Rewrites the `INSERT` in `statement` (also under `EXPLAIN`) whose rows say `DEFAULT`
/// so that it leaves those columns out; any other statement is left as it is.
async fn fill(ctx: &SessionContext, statement: &mut Statement) -> Result<()> {
    match statement {
        Statement::Insert(insert) => fill_insert(ctx, insert).await,
        Statement::Explain { statement, .. } => Box::pin(fill(ctx, statement)).await,
        _ => Ok(()),
    }
}

fn is_default(e: &Expr) -> bool {
    matches!(e, Expr::Identifier(i) if i.quote_style.is_none() && i.value.eq_ignore_ascii_case("default"))
}

/// Whether `e` holds `DEFAULT` below its top level (`DEFAULT + 1`, `(DEFAULT)`), which no
/// rewrite can mean.
fn nests_default(e: &Expr) -> bool {
    match e {
        Expr::Nested(inner) | Expr::UnaryOp { expr: inner, .. } => {
            is_default(inner) || nests_default(inner)
        }
        Expr::BinaryOp { left, right, .. } => {
            is_default(left) || is_default(right) || nests_default(left) || nests_default(right)
        }
        Expr::Cast { expr, .. } => is_default(expr) || nests_default(expr),
        _ => false,
    }
}

async fn fill_insert(ctx: &SessionContext, insert: &mut Insert) -> Result<()> {
    let Some(source) = insert.source.as_mut() else {
        return Ok(());
    };
    let SetExpr::Values(values) = source.body.as_mut() else {
        return Ok(());
    };
    let rows = &values.rows;
    if rows
        .iter()
        .flat_map(|r| r.content.iter())
        .any(nests_default)
    {
        return plan_err!(
            "DEFAULT is allowed only as a whole value of a VALUES row, not inside an expression"
        );
    }
    if !rows.iter().flat_map(|r| r.content.iter()).any(is_default) {
        return Ok(());
    }
    let Some(first) = rows.first() else {
        return Ok(());
    };
    let asks: Vec<bool> = first.content.iter().map(is_default).collect();
    for (n, row) in rows.iter().enumerate() {
        let here: Vec<bool> = row.content.iter().map(is_default).collect();
        if here != asks {
            return differing_rows(n + 1);
        }
    }
    if !asks.contains(&false) {
        return plan_err!(
            "every value of the INSERT is DEFAULT; name at least the table's key columns"
        );
    }
    let columns: Vec<ObjectName> = if insert.columns.is_empty() {
        let TableObject::TableName(name) = &insert.table else {
            return Ok(());
        };
        let table = TableReference::parse_str(&name.to_string());
        let provider = ctx.table_provider(table).await?;
        provider
            .schema()
            .fields()
            .iter()
            .map(|f| {
                ObjectName(vec![ObjectNamePart::Identifier(Ident::with_quote(
                    '"',
                    f.name().as_str(),
                ))])
            })
            .collect()
    } else {
        insert.columns.clone()
    };
    if columns.len() != asks.len() {
        return plan_err!(
            "INSERT has {} values per row and {} columns",
            asks.len(),
            columns.len()
        );
    }
    insert.columns = columns
        .into_iter()
        .zip(&asks)
        .filter(|(_, d)| !**d)
        .map(|(c, _)| c)
        .collect();
    for row in &mut values.rows {
        let kept: Vec<Expr> = std::mem::take(&mut row.content)
            .into_iter()
            .zip(&asks)
            .filter(|(_, d)| !**d)
            .map(|(e, _)| e)
            .collect();
        row.content = kept;
    }
    Ok(())
}

fn differing_rows(row: usize) -> Result<()> {
    Err(DataFusionError::Plan(format!(
        "DEFAULT must stand in the same columns of every row of one INSERT (row {row} differs); \
         write the rows that differ as separate INSERTs"
    )))
}
