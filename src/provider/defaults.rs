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
//! expression, or in a `VALUES` with `WITH`, `ORDER BY`, `LIMIT`, `OFFSET` or `FETCH`
//! (whose references to `columnN` or positions the removal would shift), all of which
//! PostgreSQL refuses too. The column list is checked here as the planner would check it
//! (an unknown or repeated name is refused), since the names left out never reach the
//! planner. Only the unquoted word counts, and only as a whole value of a `VALUES` row of an
//! `INSERT`, where no column is in scope: a quoted `"default"` is left to the planner.
//!
//! Every path that plans SQL text or a parsed statement for a session goes through here:
//! [`crate::control::sql`] (the shell and embedded applications), the wire server's simple
//! and extended protocols, and [`crate::prepared`].

use std::ops::ControlFlow;

use datafusion::common::{plan_err, DataFusionError, Result, TableReference};
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    visit_expressions, Expr, Ident, Insert, ObjectName, ObjectNamePart, SetExpr, Statement,
    TableObject,
};

/// Plans one statement's text in `state` (with `ctx`'s tables), `DEFAULT` values included.
pub async fn plan_text(
    ctx: &SessionContext,
    state: &SessionState,
    sql: &str,
) -> Result<LogicalPlan> {
    let dialect = state.config().options().sql_parser.dialect;
    let mut statement = state.sql_to_statement(sql, &dialect)?;
    // DataFusion's parser returns its own `EXPLAIN` around the statement.
    let inner = match &mut statement {
        DFStatement::Explain(e) => e.statement.as_mut(),
        other => other,
    };
    if let DFStatement::Statement(s) = inner {
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

/// Whether `e` is or holds `DEFAULT` anywhere (`coalesce(DEFAULT, 1)`, `DEFAULT IS NULL`).
fn mentions_default(e: &Expr) -> bool {
    visit_expressions(e, |x| {
        if is_default(x) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })
    .is_break()
}

async fn fill_insert(ctx: &SessionContext, insert: &mut Insert) -> Result<()> {
    let Some(source) = insert.source.as_mut() else {
        return Ok(());
    };
    let plain = source.with.is_none()
        && source.order_by.is_none()
        && source.limit_clause.is_none()
        && source.fetch.is_none();
    let SetExpr::Values(values) = source.body.as_mut() else {
        return Ok(());
    };
    let rows = &values.rows;
    if !rows
        .iter()
        .flat_map(|r| r.content.iter())
        .any(mentions_default)
    {
        return Ok(());
    }
    // As PostgreSQL: removing columns would renumber what `ORDER BY column4` or `ORDER BY
    // 4` names, so a row other than the one meant could be kept.
    if !plain {
        return plan_err!(
            "DEFAULT is allowed only in the plain VALUES list of an INSERT, \
             not with WITH, ORDER BY, LIMIT, OFFSET or FETCH"
        );
    }
    if rows
        .iter()
        .flat_map(|r| r.content.iter())
        .any(|e| !is_default(e) && mentions_default(e))
    {
        return plan_err!(
            "DEFAULT is allowed only as a whole value of a VALUES row, not inside an expression"
        );
    }
    let Some(first) = rows.first() else {
        return Ok(());
    };
    if rows.iter().any(|r| r.content.len() != first.content.len()) {
        return plan_err!("VALUES lists must all be the same length");
    }
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
    let TableObject::TableName(name) = &insert.table else {
        return plan_err!("DEFAULT is allowed only in an INSERT into a table named directly");
    };
    let table = TableReference::parse_str(&name.to_string());
    let schema = ctx.table_provider(table.clone()).await?.schema();
    // The columns named are checked here, as the planner would: the ones left out for
    // DEFAULT never reach it, and a duplicate or unknown name among them must still be
    // refused rather than silently dropped.
    let columns: Vec<ObjectName> = if insert.columns.is_empty() {
        schema
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
        let mut seen = std::collections::HashSet::new();
        for c in &insert.columns {
            let [ObjectNamePart::Identifier(ident)] = c.0.as_slice() else {
                return plan_err!("column {c} of an INSERT must be a plain column name");
            };
            let column = match ident.quote_style {
                None => ident.value.to_ascii_lowercase(),
                Some(_) => ident.value.clone(),
            };
            if schema.field_with_name(&column).is_err() {
                return plan_err!("column \"{column}\" of relation \"{table}\" does not exist");
            }
            if !seen.insert(column.clone()) {
                return plan_err!("column \"{column}\" specified more than once");
            }
        }
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
