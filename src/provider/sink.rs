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
        Self {
            table,
            schema: surface.schema(),
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
