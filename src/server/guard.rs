//! What a connection may run: roles, and the two gates every statement passes.
//!
//! A user has one [`Role`]: `read` (queries, EXPLAIN, SHOW, the system tables), `write`
//! (and INSERT, DELETE and UPDATE on Pulpitum tables) or `admin` (and the control statements, and the job
//! history's error texts and worker names). Every statement is judged twice:
//!
//! 1. [`statement_kind`], on the parsed statement, before anything is planned: the kinds
//!    the server knows how to answer (queries, INSERT, EXPLAIN, SET/RESET/SHOW,
//!    transactions, cursors, the control statements) pass; every other statement is
//!    refused with SQLSTATE 42501 here, so it is never planned, let alone executed.
//! 2. [`plan_need`], on the `LogicalPlan` that will run, with its subqueries: DDL of any
//!    kind (`SELECT ... INTO` plans as `CREATE TABLE`), `COPY`, planner-level `SET` and
//!    `PREPARE`, DML other than INSERT, DELETE and UPDATE on a Pulpitum table, and unknown
//!    extension nodes are refused; what remains needs `read`, or `write` for those three.
//!
//! The control statements (`ALTER TABLE ... SET (...)`, `SYSTEM STOP MOVES`) are recognised
//! from the text before any parsing and need `admin`; the handlers check that with
//! [`authorize`] on their own path, before a statement reaches either gate.
//!
//! The decision is made on the plan because the text can hide what runs: DataFusion plans
//! `SELECT count(*) INTO t FROM chat` as a table creation, and executes DDL the moment it
//! plans it through `SessionContext::sql`. So the handlers never call `sql` on a client's
//! text: they plan, judge the plan here, then execute that same plan.

use std::fmt;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::{DdlStatement, LogicalPlan, Statement as PlanStatement, WriteOp};
use datafusion::sql::sqlparser::ast::Statement;
use datafusion_postgres::pgwire::error::{ErrorInfo, PgWireError};

/// What a user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Queries, EXPLAIN, SHOW, the system tables (without job error texts and workers).
    Read,
    /// `read`, and INSERT, DELETE and UPDATE on Pulpitum tables.
    Write,
    /// `write`, the control statements and the job history's details.
    Admin,
}

impl Role {
    /// The role named `name` (`read`, `write`, `admin`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "read" => Some(Self::Read),
            "write" => Some(Self::Write),
            "admin" => Some(Self::Admin),
            _ => None,
        }
    }

    /// The role's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn refuse(code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".into(),
        code.into(),
        message,
    )))
}

/// Refuses `what` unless `role` is at least `needed` (SQLSTATE 42501).
pub fn authorize(role: Role, needed: Role, what: &str) -> Result<(), PgWireError> {
    if role >= needed {
        Ok(())
    } else {
        Err(refuse(
            "42501",
            format!("permission denied: {what} needs the {needed} role; this user has {role}"),
        ))
    }
}

/// The statement kinds the server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Planned and executed: queries, INSERT, EXPLAIN, SHOW TABLES/COLUMNS.
    Plan,
    /// `SET` or `RESET` of a session variable (see [`super::vars`]).
    Variable,
    /// `SHOW name`.
    Show,
    /// `BEGIN`, `COMMIT`, `ROLLBACK`.
    Transaction,
    /// `DECLARE`, `FETCH`, `CLOSE`.
    Cursor,
}

const ALLOWED: &str =
    "queries, INSERT, DELETE, UPDATE, EXPLAIN, SET, SHOW, transactions, cursors, ALTER TABLE ... \
     SET/RESET (...) and SYSTEM STOP/START MOVES are; use the pulpitum shell for the rest";

/// The first gate: which kind `s` is, or a refusal (42501) for every other statement.
pub fn statement_kind(s: &Statement) -> Result<Kind, PgWireError> {
    Ok(match s {
        Statement::Query(_)
        | Statement::Insert(_)
        | Statement::Update(_)
        | Statement::Delete(_)
        | Statement::Explain { .. }
        | Statement::ShowTables { .. }
        | Statement::ShowColumns { .. } => Kind::Plan,
        Statement::Set(_) | Statement::Reset(_) => Kind::Variable,
        Statement::ShowVariable { .. } | Statement::ShowStatus { .. } => Kind::Show,
        Statement::Rollback {
            savepoint: Some(_), ..
        }
        | Statement::Savepoint { .. }
        | Statement::ReleaseSavepoint { .. } => {
            return Err(refuse(
                "0A000",
                "savepoints are not supported: each statement commits on its own".into(),
            ))
        }
        Statement::StartTransaction { .. }
        | Statement::Commit { .. }
        | Statement::Rollback { .. } => Kind::Transaction,
        Statement::Declare { .. } | Statement::Fetch { .. } | Statement::Close { .. } => {
            Kind::Cursor
        }
        other => return Err(refused_statement(&other.to_string())),
    })
}

/// The refusal of a statement the server does not run, naming its first words only (the
/// rest may be long, or hold a literal the client would rather not see echoed).
pub fn refused_statement(text: &str) -> PgWireError {
    let head: Vec<&str> = text.split_whitespace().take(3).collect();
    refuse(
        "42501",
        format!(
            "{} ... is not allowed over the wire: {ALLOWED}",
            head.join(" ")
        ),
    )
}

/// Whether `plan` holds a row change anywhere (subqueries included).
fn writes(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let walk = plan.apply_with_subqueries(|n| {
        found = matches!(n, LogicalPlan::Dml(_));
        Ok(if found {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    // A walk that failed is judged as writing: refused rather than let through.
    found || walk.is_err()
}

/// The second gate: the role a plan needs to run, or a refusal. Walks every node,
/// subqueries included.
pub fn plan_need(plan: &LogicalPlan) -> Result<Role, PgWireError> {
    let mut need = Role::Read;
    let mut refusal = None;
    let walk = plan.apply_with_subqueries(|node| {
        let verdict = match node {
            // Its input runs on a task of its own, outside the statement's commit gate, so
            // a timeout could answer 57014 for a write that committed (break-it finding).
            LogicalPlan::Analyze(a) if writes(&a.input) => Err(refuse(
                "0A000",
                "EXPLAIN ANALYZE of INSERT, DELETE or UPDATE is not supported over the wire: \
                 run the statement itself, or EXPLAIN without ANALYZE"
                    .into(),
            )),
            LogicalPlan::Ddl(ddl) => Err(refused_statement(&ddl_name(ddl))),
            LogicalPlan::Copy(_) => Err(refused_statement("COPY")),
            LogicalPlan::Statement(s) => match s {
                PlanStatement::TransactionStart(_) | PlanStatement::TransactionEnd(_) => Ok(()),
                PlanStatement::SetVariable(_) | PlanStatement::ResetVariable(_) => {
                    Err(refused_statement("SET"))
                }
                _ => Err(refused_statement(&s.name().to_uppercase())),
            },
            LogicalPlan::Dml(dml) => match dml.op {
                WriteOp::Insert(_) | WriteOp::Delete | WriteOp::Update => {
                    let pulpitum = source_as_provider(&dml.target)
                        .map(|p| crate::provider::factory::is_pulpitum(&p))
                        .unwrap_or(false);
                    if pulpitum {
                        need = need.max(Role::Write);
                        Ok(())
                    } else {
                        Err(refuse(
                            "42501",
                            format!(
                                "{} {}: only Pulpitum tables change rows over the wire",
                                dml.op.name(),
                                dml.table_name
                            ),
                        ))
                    }
                }
                _ => Err(refuse(
                    "0A000",
                    format!("{} is not supported; see docs/sql.md", dml.op.name()),
                )),
            },
            LogicalPlan::Extension(e) => Err(refused_statement(e.node.name())),
            _ => Ok(()),
        };
        match verdict {
            Ok(()) => Ok(TreeNodeRecursion::Continue),
            Err(e) => {
                refusal = Some(e);
                Ok(TreeNodeRecursion::Stop)
            }
        }
    });
    if let Err(e) = walk {
        return Err(PgWireError::ApiError(Box::new(e)));
    }
    match refusal {
        Some(e) => Err(e),
        None => Ok(need),
    }
}

/// Refuses a text whose select list holds a subquery that the server's SQL parser would
/// silently replace by NULL. datafusion-postgres's compatibility parser does that to every
/// subquery in a select list that refers to the outer query or to a parameter (it is meant
/// for psql's catalog queries, which DataFusion cannot plan otherwise): `SELECT id, (SELECT
/// max(c2.id) FROM chat c2 WHERE c2.id < c.id) FROM chat c` answered NULL, a wrong answer
/// (break-it finding). Such a statement is refused with 0A000 unless it reads the catalog
/// (`pg_catalog`, `information_schema`, a `pg_` table), where psql relies on it.
pub fn no_dropped_subquery(text: &str) -> Result<(), PgWireError> {
    use datafusion::sql::sqlparser::ast::{Expr, Visit, Visitor};
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    use datafusion_postgres::datafusion_pg_catalog::sql::rules::{
        RemoveSubqueryFromProjection, SqlStatementRewriteRule,
    };
    use std::ops::ControlFlow;

    /// Counts subqueries, and whether a relation of the catalog is named.
    #[derive(Default)]
    struct Seen {
        subqueries: usize,
        catalog: bool,
    }
    impl Visitor for Seen {
        type Break = ();
        fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
            self.subqueries += usize::from(matches!(e, Expr::Subquery(_)));
            ControlFlow::Continue(())
        }
        fn pre_visit_relation(
            &mut self,
            name: &datafusion::sql::sqlparser::ast::ObjectName,
        ) -> ControlFlow<()> {
            let first = name
                .0
                .first()
                .and_then(|p| p.as_ident())
                .map(|i| i.value.to_lowercase());
            let last = name
                .0
                .last()
                .and_then(|p| p.as_ident())
                .map(|i| i.value.to_lowercase());
            self.catalog |= matches!(first.as_deref(), Some("pg_catalog" | "information_schema"))
                || last.is_some_and(|l| l.starts_with("pg_"));
            ControlFlow::Continue(())
        }
    }
    fn seen(s: &Statement) -> Seen {
        let mut v = Seen::default();
        let _ = s.visit(&mut v);
        v
    }
    // A text this parser refuses is refused where it is parsed, with its own error.
    let Ok(statements) = Parser::parse_sql(&PostgreSqlDialect {}, text) else {
        return Ok(());
    };
    for statement in statements {
        let before = seen(&statement);
        if before.subqueries == 0 || before.catalog {
            continue;
        }
        let after = seen(&RemoveSubqueryFromProjection.rewrite(statement));
        if after.subqueries < before.subqueries {
            return Err(refuse(
                "0A000",
                "a subquery in the select list that refers to the outer query or to a \
                 parameter is not supported: write it as a join, or move it to the WHERE \
                 clause"
                    .into(),
            ));
        }
    }
    Ok(())
}

fn ddl_name(ddl: &DdlStatement) -> String {
    match ddl {
        DdlStatement::CreateMemoryTable(_) => "CREATE TABLE (or SELECT ... INTO)".into(),
        other => other.name().to_uppercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    fn parse(sql: &str) -> Statement {
        Parser::parse_sql(&PostgreSqlDialect {}, sql)
            .unwrap()
            .remove(0)
    }

    async fn plan(ctx: &SessionContext, sql: &str) -> LogicalPlan {
        ctx.state().create_logical_plan(sql).await.unwrap()
    }

    fn message(e: PgWireError) -> String {
        match e {
            PgWireError::UserError(info) => format!("{} {}", info.code, info.message),
            other => other.to_string(),
        }
    }

    #[test]
    fn only_known_statement_kinds_pass_the_first_gate() {
        for (sql, kind) in [
            ("SELECT 1", Kind::Plan),
            ("INSERT INTO t VALUES (1)", Kind::Plan),
            ("DELETE FROM chat WHERE id = 1", Kind::Plan),
            ("UPDATE chat SET content = 'x' WHERE id = 1", Kind::Plan),
            ("EXPLAIN SELECT 1", Kind::Plan),
            ("SET TimeZone = 'UTC'", Kind::Variable),
            ("RESET ALL", Kind::Variable),
            ("SHOW statement_timeout", Kind::Show),
            ("BEGIN", Kind::Transaction),
            ("DECLARE c CURSOR FOR SELECT 1", Kind::Cursor),
        ] {
            assert_eq!(statement_kind(&parse(sql)).unwrap(), kind, "{sql}");
        }
        for sql in [
            "CREATE TABLE t (a INT)",
            "DROP TABLE chat",
            "ALTER TABLE chat ADD COLUMN x INT",
            "ALTER TABLE chat SET (archive_after = '90 days')",
            "COPY chat TO '/tmp/x'",
            "PREPARE p AS SELECT 1",
            "CREATE VIEW v AS SELECT 1",
        ] {
            let e = message(statement_kind(&parse(sql)).unwrap_err());
            assert!(e.starts_with("42501"), "{sql}: {e}");
        }
    }

    #[tokio::test]
    async fn plans_that_create_or_change_things_are_refused() {
        let ctx = SessionContext::new();
        ctx.sql("CREATE TABLE mem (a BIGINT)").await.unwrap();
        assert_eq!(
            plan_need(&plan(&ctx, "SELECT 1").await).unwrap(),
            Role::Read
        );
        assert_eq!(
            plan_need(&plan(&ctx, "SELECT * FROM mem WHERE a IN (SELECT 1)").await).unwrap(),
            Role::Read
        );
        // SELECT INTO is a table creation; so is a CTE-wrapped one.
        for sql in [
            "SELECT count(*) INTO squat FROM mem",
            "CREATE TABLE x AS SELECT 1",
            "CREATE VIEW v AS SELECT 1",
            "COPY (SELECT 1) TO '/tmp/pulpitum-never-written.csv'",
        ] {
            let e = message(plan_need(&plan(&ctx, sql).await).unwrap_err());
            assert!(e.starts_with("42501"), "{sql}: {e}");
        }
        // INSERT into a table that is not Pulpitum's (a memory table, a catalog table).
        let e = message(plan_need(&plan(&ctx, "INSERT INTO mem VALUES (1)").await).unwrap_err());
        assert!(e.contains("only Pulpitum tables"), "{e}");
        let e = message(plan_need(&plan(&ctx, "DELETE FROM mem WHERE a = 1").await).unwrap_err());
        assert!(
            e.starts_with("42501") && e.contains("only Pulpitum tables"),
            "{e}"
        );
        let e = message(
            plan_need(&plan(&ctx, "SET datafusion.execution.batch_size = 1").await).unwrap_err(),
        );
        assert!(e.starts_with("42501"), "{e}");
    }

    #[test]
    fn roles_are_ordered() {
        assert!(authorize(Role::Admin, Role::Write, "INSERT").is_ok());
        assert!(authorize(Role::Write, Role::Write, "INSERT").is_ok());
        let e = message(authorize(Role::Read, Role::Write, "INSERT").unwrap_err());
        assert_eq!(
            e,
            "42501 permission denied: INSERT needs the write role; this user has read"
        );
        assert_eq!(Role::parse("admin"), Some(Role::Admin));
        assert_eq!(Role::parse("Admin"), None);
    }
}
