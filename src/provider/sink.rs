//! `INSERT INTO` for Pulpitum tables: rows become records and go through fenced appends.
//!
//! Rows are appended in batches of [`INSERT_BATCH_ROWS`]; each batch is one atomic
//! `append_batch` (all rows or none). A row aimed at a bucket that is Archiving or Archived
//! fails its batch, and so the statement, with an error naming the bucket. Batches committed
//! before a failing one stay committed (the statement is not one transaction); re-running
//! the statement is safe because appending an identical record again is a no-op.

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

/// Rows per atomic append.
pub const INSERT_BATCH_ROWS: usize = 500;

/// The sink behind `INSERT INTO`.
#[derive(Debug)]
pub struct PulpitumSink {
    table: DurableTable,
    surface: Surface,
    schema: SchemaRef,
}

impl PulpitumSink {
    /// A sink for the table's surface.
    pub fn new(table: DurableTable, surface: Surface) -> Self {
        Self {
            table,
            surface,
            schema: surface.schema(),
        }
    }

    async fn flush(&self, pending: &mut Vec<Record>) -> Result<u64, ProviderError> {
        if pending.is_empty() {
            return Ok(0);
        }
        let out = self.table.append_batch(pending).await?;
        pending.clear();
        Ok(out.inserted + out.already_present)
    }
}

impl DisplayAs for PulpitumSink {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PulpitumSink: table={}, surface={}, batch_rows={}",
            self.table.definition().table_id,
            self.surface.as_str(),
            INSERT_BATCH_ROWS
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
        mut data: SendableRecordBatchStream,
        _context: &Arc<TaskContext>,
    ) -> DFResult<u64> {
        let mut pending: Vec<Record> = Vec::with_capacity(INSERT_BATCH_ROWS);
        let mut written = 0u64;
        while let Some(batch) = data.next().await {
            let batch = batch?;
            let records = self
                .surface
                .batch_to_records(&batch)
                .map_err(DataFusionError::from)?;
            for r in records {
                pending.push(r);
                if pending.len() >= INSERT_BATCH_ROWS {
                    written += self
                        .flush(&mut pending)
                        .await
                        .map_err(DataFusionError::from)?;
                }
            }
        }
        written += self
            .flush(&mut pending)
            .await
            .map_err(DataFusionError::from)?;
        Ok(written)
    }
}
