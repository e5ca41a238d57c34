//! The interactive shell and the script runner behind `pulpitum` and `pulpitum demo`.
//!
//! Interactive use has line editing and a history file (`~/.pulpitum_history`); a statement
//! may span lines and ends with `;`. Meta-commands: `\d` (tables), `\d NAME` (columns),
//! `\buckets [NAME]` (the tiering queue), `\timing` (toggle), `\q`. A script (from `-c`,
//! `-f` or piped standard input) stops at its first error. Queries asked again with other
//! values run their prepared shape. Results print as a table, CSV or JSON.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::ValueEnum;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches_with_schema;
use datafusion::prelude::SessionContext;
use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;

use super::script::{split_script, statement_complete, Item};
use crate::prepared::shapes::ShapeCache;

/// The format results are printed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// An aligned table with a row count.
    Table,
    /// CSV with a header line.
    Csv,
    /// One JSON object per line.
    Json,
}

/// The shell over one session: statements, meta-commands, scripts and the line editor.
pub struct Shell {
    ctx: SessionContext,
    format: Format,
    timing: bool,
    /// Prepared shapes of the queries typed so far.
    shapes: ShapeCache,
}

/// Query shapes the shell keeps prepared.
const SHAPES: usize = 64;

/// Most queued buckets `\buckets` prints.
const BUCKETS_SHOWN: usize = 100;

/// What a meta-command asks for.
enum Meta {
    Quit,
    Handled,
}

impl Shell {
    /// A shell over `ctx`, printing results as `format`.
    pub fn new(ctx: SessionContext, format: Format) -> Self {
        Self {
            ctx,
            format,
            timing: false,
            shapes: ShapeCache::new(SHAPES),
        }
    }

    /// The session.
    pub fn ctx(&self) -> &SessionContext {
        &self.ctx
    }

    /// Runs one statement and prints its result.
    pub async fn run_statement(&mut self, sql: &str) -> Result<(), String> {
        let start = Instant::now();
        // The wire server's limits on a statement's nesting: past them, parsing or planning
        // could overflow the thread's stack (aborting the shell) or never end.
        if let Some(why) = crate::server::shape_refusal(sql) {
            return Err(why);
        }
        // A query asked again with other values runs its prepared shape.
        if let Some((schema, stream)) = self.shapes.query(&self.ctx, sql).await {
            let batches = datafusion::physical_plan::common::collect(stream)
                .await
                .map_err(|e| e.to_string())?;
            self.print(&schema, &batches)?;
            if self.timing {
                eprintln!("Time: {:.3} ms", start.elapsed().as_secs_f64() * 1e3);
            }
            return Ok(());
        }
        // Control statements, then what `ctx.sql` does with the check of statements
        // DataFusion would let through silently (`DROP TABLE IF EXISTS` on a Pulpitum table).
        let df = crate::control::sql(&self.ctx, sql)
            .await
            .map_err(|e| e.to_string())?;
        // Anything but a query may change tables: shapes are prepared afresh after it.
        if !matches!(
            df.logical_plan(),
            datafusion::logical_expr::LogicalPlan::Projection(_)
                | datafusion::logical_expr::LogicalPlan::Sort(_)
                | datafusion::logical_expr::LogicalPlan::Limit(_)
                | datafusion::logical_expr::LogicalPlan::Aggregate(_)
                | datafusion::logical_expr::LogicalPlan::Filter(_)
        ) {
            self.shapes.clear();
        }
        // The result's columns come from the plan, not from the batches: an empty result may
        // have no batch at all, and it still prints its header.
        let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
        let batches = df.collect().await.map_err(|e| e.to_string())?;
        self.print(&schema, &batches)?;
        if self.timing {
            eprintln!("Time: {:.3} ms", start.elapsed().as_secs_f64() * 1e3);
        }
        Ok(())
    }

    /// Prints a result. A statement without result columns (DDL) prints nothing; any other
    /// result prints its header even with no rows (`(0 rows)` in table format, the header
    /// line in CSV), so an empty answer is told apart from no answer.
    fn print(&self, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<(), String> {
        if schema.fields().is_empty() {
            return Ok(());
        }
        let mut out = super::stdout();
        match self.format {
            Format::Table => {
                let text = pretty_format_batches_with_schema(schema.clone(), batches)
                    .map_err(|e| e.to_string())?;
                writeln!(out, "{text}").map_err(|e| e.to_string())?;
                let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
                writeln!(out, "({rows} row{})", if rows == 1 { "" } else { "s" })
                    .map_err(|e| e.to_string())?;
            }
            Format::Csv => {
                let mut w = datafusion::arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(&mut out);
                // The writer prints the header with its first batch, so an empty result
                // gets one empty batch of the result's schema.
                let empty = [RecordBatch::new_empty(schema.clone())];
                let batches = if batches.is_empty() {
                    &empty[..]
                } else {
                    batches
                };
                for b in batches {
                    w.write(b).map_err(|e| e.to_string())?;
                }
            }
            Format::Json => {
                let mut w = datafusion::arrow::json::LineDelimitedWriter::new(&mut out);
                let refs: Vec<&RecordBatch> = batches.iter().collect();
                w.write_batches(&refs).map_err(|e| e.to_string())?;
                w.finish().map_err(|e| e.to_string())?;
            }
        }
        out.flush().map_err(|e| e.to_string())
    }

    async fn meta(&mut self, line: &str) -> Result<Meta, String> {
        let mut parts = line.split_whitespace();
        match (parts.next(), parts.next()) {
            (Some("\\q"), _) => Ok(Meta::Quit),
            (Some("\\timing"), _) => {
                self.timing = !self.timing;
                eprintln!("Timing is {}.", if self.timing { "on" } else { "off" });
                Ok(Meta::Handled)
            }
            (Some("\\d"), None) => {
                self.run_statement(
                    "SELECT table_name FROM information_schema.tables \
                     WHERE table_schema = 'public' ORDER BY table_name",
                )
                .await?;
                Ok(Meta::Handled)
            }
            (Some("\\d"), Some(name)) => {
                self.describe(name).await?;
                Ok(Meta::Handled)
            }
            (Some("\\buckets"), name) => {
                self.buckets(name).await?;
                Ok(Meta::Handled)
            }
            (Some(other), _) => Err(format!(
                "unknown command {other} (try \\d, \\d NAME, \\buckets [NAME], \\timing, \\q)"
            )),
            (None, _) => Ok(Meta::Handled),
        }
    }

    /// `\d NAME`: the table's columns with their SQL types (as psql shows them through
    /// `pulpitum serve`) and whether they may be null.
    async fn describe(&mut self, name: &str) -> Result<(), String> {
        use datafusion::arrow::array::{ArrayRef, StringArray};
        let table = self.ctx.table(name).await.map_err(|e| e.to_string())?;
        let fields = table.schema().fields().clone();
        let column = |f: &dyn Fn(&datafusion::arrow::datatypes::Field) -> String| -> ArrayRef {
            Arc::new(StringArray::from(
                fields.iter().map(|x| f(x)).collect::<Vec<String>>(),
            ))
        };
        let batch = RecordBatch::try_from_iter([
            ("column_name", column(&|f| f.name().clone())),
            (
                "type",
                column(&|f| crate::provider::surface::sql_type_name(f.data_type())),
            ),
            (
                "nullable",
                column(&|f| if f.is_nullable() { "yes" } else { "no" }.to_string()),
            ),
        ])
        .map_err(|e| e.to_string())?;
        self.print(&batch.schema(), &[batch])
    }

    /// `\buckets [NAME]`: the tiering queue, every bucket not yet archived and cleaned up (of
    /// one table, or all), oldest first, with whether it is eligible and why; then a count
    /// per state. A queue longer than [`BUCKETS_SHOWN`] is cut, and a line on standard error
    /// says so; a name that is no table is an error.
    async fn buckets(&mut self, table: Option<&str>) -> Result<(), String> {
        let start = Instant::now();
        let v = crate::control::queue::view(&self.ctx, table, BUCKETS_SHOWN)
            .await
            .map_err(|e| e.to_string())?;
        self.print(&v.queue_schema, &v.queue)?;
        if v.shown < v.total {
            eprintln!(
                "(the oldest {} of {} queued buckets; SELECT ... FROM pulpitum_buckets shows them all)",
                v.shown, v.total
            );
        }
        self.print(&v.counts_schema, &v.counts)?;
        if self.timing {
            eprintln!("Time: {:.3} ms", start.elapsed().as_secs_f64() * 1e3);
        }
        Ok(())
    }

    /// Runs a script: statements and meta-commands; stops at the first error.
    pub async fn run_script(&mut self, text: &str) -> Result<(), String> {
        for item in split_script(text) {
            match item {
                Item::Meta(line) => {
                    if let Meta::Quit = self.meta(&line).await? {
                        return Ok(());
                    }
                }
                Item::Sql(sql) => self.run_statement(&sql).await?,
            }
        }
        Ok(())
    }

    /// The interactive shell on a terminal; otherwise standard input is a script, run to
    /// its end or its first error (`echo "SELECT 1;" | pulpitum`, and the same after
    /// `pulpitum demo`).
    pub async fn interactive_or_stdin(&mut self) -> Result<(), String> {
        if std::io::stdin().is_terminal() {
            return self.interactive().await;
        }
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| format!("reading standard input: {e}"))?;
        self.run_script(&text).await
    }

    async fn interactive(&mut self) -> Result<(), String> {
        let mut rl = DefaultEditor::new().map_err(|e| e.to_string())?;
        let history = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pulpitum_history"));
        if let Some(h) = &history {
            let _ = rl.load_history(h);
        }
        let mut buffer = String::new();
        loop {
            let prompt = if buffer.is_empty() {
                "pulpitum> "
            } else {
                "pulpitum-> "
            };
            match rl.readline(prompt) {
                Ok(line) => {
                    let trimmed = line.trim();
                    if buffer.is_empty() && trimmed.starts_with('\\') {
                        let _ = rl.add_history_entry(trimmed);
                        match self.meta(trimmed).await {
                            Ok(Meta::Quit) => break,
                            Ok(Meta::Handled) => {}
                            Err(e) => eprintln!("Error: {e}"),
                        }
                        continue;
                    }
                    if trimmed.is_empty() && buffer.is_empty() {
                        continue;
                    }
                    buffer.push_str(&line);
                    buffer.push('\n');
                    if statement_complete(&buffer) {
                        let text = std::mem::take(&mut buffer);
                        let _ = rl.add_history_entry(text.trim());
                        for item in split_script(&text) {
                            let res = match item {
                                Item::Sql(sql) => self.run_statement(&sql).await,
                                Item::Meta(m) => self.meta(&m).await.map(|_| ()),
                            };
                            if let Err(e) = res {
                                eprintln!("Error: {e}");
                            }
                        }
                    }
                }
                Err(ReadlineError::Interrupted) => buffer.clear(),
                Err(ReadlineError::Eof) => break,
                Err(e) => return Err(e.to_string()),
            }
        }
        if let Some(h) = &history {
            let _ = rl.save_history(h);
        }
        Ok(())
    }
}
