//! `INSERT INTO` for Pulpitum tables: rows become records and go through one fenced append.
//!
//! A statement is all or nothing. Its rows are collected, then written by ONE
//! `append_batch`, which both stores run as one serializable transaction: the Hot check of
//! every bucket the statement touches and every insert commit together, so a failure
//! anywhere (a fenced bucket, a key holding another value, a lost connection) leaves
//! nothing of the statement behind, and a retry cannot duplicate half of it. Collecting is
//! bounded by a row cap ([`DEFAULT_MAX_INSERT_ROWS`], `ProviderOptions::max_insert_rows`):
//! a statement that brings more rows fails as soon as it passes the cap, before anything is
//! written. The count returned is the rows the statement actually inserted; identical
//! records already stored (a retried statement) are not counted.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::datasource::sink::DataSink;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType};
use futures::StreamExt;

use super::surface::Surface;
use super::ProviderError;
use crate::model::Record;
use crate::table::DurableTable;

/// Most rows one `INSERT` statement may write by default. The statement is one transaction
/// held in memory until it commits, so the cap bounds both the memory of a statement and
/// the size of the transaction the hot store must accept; bulk loads larger than this
/// belong in several statements (each atomic) or in `append_batch` calls.
pub const DEFAULT_MAX_INSERT_ROWS: usize = 50_000;

/// The sink behind `INSERT INTO`.
#[derive(Debug)]
pub struct PulpitumSink {
    table: DurableTable,
    surface: Surface,
    schema: SchemaRef,
    max_rows: usize,
}

impl PulpitumSink {
    /// A sink for the table's surface that refuses statements of more than `max_rows` rows.
    pub fn new(table: DurableTable, surface: Surface, max_rows: usize) -> Self {
        // Every column nullable to DataFusion: its own NOT NULL check names a column by
        // position (`column at '3' has null`); each surface's conversion checks every
        // NOT NULL column and names it.
        let schema = surface.incoming_schema();
        Self {
            table,
            schema,
            surface,
            max_rows,
        }
    }

    /// Collects the statement's rows (failing past the cap, before any write), then writes
    /// them in one atomic append and returns the rows inserted.
    async fn write(&self, mut data: SendableRecordBatchStream) -> DFResult<u64> {
        let mut pending: Vec<Record> = Vec::new();
        while let Some(batch) = data.next().await {
            let batch = batch?;
            let rows = pending.len() + batch.num_rows();
            if rows > self.max_rows {
                return Err(ProviderError::InsertTooLarge {
                    rows,
                    max_rows: self.max_rows,
                }
                .into());
            }
            pending.extend(
                self.surface
                    .batch_to_records(&batch)
                    .map_err(DataFusionError::from)?,
            );
        }
        if pending.is_empty() {
            return Ok(0);
        }
        if let Surface::Declared(d) = &self.surface {
            d.check_current(&self.table, "INSERT").await?;
        }
        let out = self
            .table
            .append_batch(&pending)
            .await
            .map_err(|e| DataFusionError::from(ProviderError::from(e)))?;
        Ok(out.inserted)
    }
}

impl DisplayAs for PulpitumSink {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PulpitumSink: table={}, surface={}, atomic, max_rows={}",
            self.table.definition().table_id,
            self.surface.as_str(),
            self.max_rows
        )
    }
}

#[async_trait]
impl DataSink for PulpitumSink {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    async fn write_all(
        &self,
        data: SendableRecordBatchStream,
        _context: &Arc<TaskContext>,
    ) -> DFResult<u64> {
        self.write(data).await
    }
}

/// An analyzer rule for `INSERT`: the `VALUES` rows of an insert are typed by the target's
/// columns, NOT NULL flags included, so a `NULL` there failed while DataFusion built the
/// batch, naming a generated column (`Column 'column4' is declared as non-nullable`). This
/// rule makes the `VALUES` of an insert nullable, so the rows reach the sink, whose
/// conversion names the column (`column kind: must not be NULL`). Nothing is written
/// either way: the statement fails before its one append.
#[derive(Debug, Default, Clone, Copy)]
pub struct InsertNullsByName;

impl datafusion::optimizer::analyzer::AnalyzerRule for InsertNullsByName {
    fn analyze(
        &self,
        plan: datafusion::logical_expr::LogicalPlan,
        _config: &datafusion::common::config::ConfigOptions,
    ) -> DFResult<datafusion::logical_expr::LogicalPlan> {
        use datafusion::common::tree_node::{Transformed, TreeNode};
        use datafusion::common::DFSchema;
        use datafusion::logical_expr::{DmlStatement, LogicalPlan, Values, WriteOp};
        let LogicalPlan::Dml(dml) = plan else {
            return Ok(plan);
        };
        if !matches!(dml.op, WriteOp::Insert(_)) {
            return Ok(LogicalPlan::Dml(dml));
        }
        let input = Arc::unwrap_or_clone(dml.input.clone())
            .transform_up(|node| match node {
                LogicalPlan::Values(v) => {
                    let fields: Vec<_> = v
                        .schema
                        .iter()
                        .map(|(q, f)| {
                            (q.cloned(), Arc::new(f.as_ref().clone().with_nullable(true)))
                        })
                        .collect();
                    let schema = DFSchema::new_with_metadata(fields, v.schema.metadata().clone())?;
                    Ok(Transformed::yes(LogicalPlan::Values(Values {
                        schema: Arc::new(schema),
                        values: v.values,
                    })))
                }
                // Above a changed VALUES, each node's schema follows its input's.
                other => Ok(Transformed::yes(other.recompute_schema()?)),
            })?
            .data;
        Ok(LogicalPlan::Dml(DmlStatement {
            input: Arc::new(input),
            ..dml
        }))
    }

    fn name(&self) -> &str {
        "pulpitum_insert_nulls_by_name"
    }
}
