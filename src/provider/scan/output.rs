//! The scan's output side: envelope chunks turned into the surface's record batches under
//! the query's limits on rows, bytes and time, and the prefetch that keeps the next unit's
//! reads going while the current one is decoded. Split from the scan node itself, which
//! plans, tells the optimiser what it knows and chooses the units to read.

use std::sync::atomic::Ordering as AtomicOrdering;
use std::time::{Duration, Instant};

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::runtime::SpawnedTask;
use datafusion::error::DataFusionError;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::SendableRecordBatchStream;
use futures::stream::{self, BoxStream, StreamExt};

use super::PulpitumScanExec;
use crate::provider::metrics::batch_bytes;
use crate::provider::{ProviderError, QueryLimits};
use crate::table::{BucketChunk, RowLimit, TableError};

impl PulpitumScanExec {
    /// The scan's output: envelope chunks, already cut to the scan's row limit by the table,
    /// turned into the surface's columns under the query's limits on rows, bytes and time.
    pub(super) fn surface_stream(
        &self,
        chunks: BoxStream<'static, Result<BucketChunk, TableError>>,
        limit: RowLimit,
        started: Instant,
    ) -> SendableRecordBatchStream {
        let spec = &self.spec;
        let schema = self.schema.clone();
        let shared = self.shared.clone();
        let surface = spec.surface.clone();
        let projection = spec.projection.clone();
        let limits = spec.limits;
        let out_schema = schema.clone();
        let out = stream::unfold((chunks, false), move |(mut chunks, done)| {
            let out_schema = out_schema.clone();
            let projection = projection.clone();
            let shared = shared.clone();
            let limit = limit.clone();
            let surface = surface.clone();
            async move {
                // Not even polled once the limit is reached.
                if done || limit.is_spent() {
                    return None;
                }
                let next = match limits.max_duration {
                    Some(max) => {
                        let left = max.saturating_sub(started.elapsed());
                        match tokio::time::timeout(left, chunks.next()).await {
                            Ok(n) => n,
                            Err(_) => {
                                let e = ProviderError::LimitExceeded(format!(
                                    "query ran longer than max_duration {max:?}"
                                ));
                                return Some((Err(e.into()), (chunks, true)));
                            }
                        }
                    }
                    None => chunks.next().await,
                };
                let chunk = match next {
                    None => return None,
                    Some(Err(e)) => {
                        return Some((Err(ProviderError::from(e).into()), (chunks, true)))
                    }
                    Some(Ok(c)) => c,
                };
                let res = (|| -> Result<RecordBatch, ProviderError> {
                    let env = chunk.batch;
                    let rows = shared
                        .rows
                        .fetch_add(env.num_rows() as u64, AtomicOrdering::SeqCst)
                        + env.num_rows() as u64;
                    let env_bytes = batch_bytes(&env) as u64;
                    let bytes =
                        shared.bytes.fetch_add(env_bytes, AtomicOrdering::SeqCst) + env_bytes;
                    limits.check(rows, bytes, started.elapsed())?;
                    surface.envelope_to_surface(&env, &projection, &out_schema)
                })();
                let failed = res.is_err();
                Some((res.map_err(DataFusionError::from), (chunks, failed)))
            }
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, out))
    }
}

/// Chunks a prefetching unit may hold before its consumer takes them.
pub(super) const PREFETCH_CHUNKS: usize = 2;

/// Drives `unit` in a task of its own, handing its chunks over through a bounded channel.
pub(super) fn prefetched(
    mut unit: BoxStream<'static, Result<BucketChunk, TableError>>,
) -> BoxStream<'static, Result<BucketChunk, TableError>> {
    let (tx, rx) = tokio::sync::mpsc::channel(PREFETCH_CHUNKS);
    let task = SpawnedTask::spawn(async move {
        while let Some(item) = unit.next().await {
            if tx.send(item).await.is_err() {
                break;
            }
        }
    });
    // The task lives as long as the receiving stream: dropping the stream aborts it.
    stream::unfold((rx, task), |(mut rx, task)| async move {
        rx.recv().await.map(|item| (item, (rx, task)))
    })
    .boxed()
}

impl QueryLimits {
    fn check(&self, rows: u64, bytes: u64, elapsed: Duration) -> Result<(), ProviderError> {
        if let Some(max) = self.max_rows {
            if rows > max {
                return Err(ProviderError::LimitExceeded(format!(
                    "query scanned more than max_rows = {max} rows"
                )));
            }
        }
        if let Some(max) = self.max_bytes {
            if bytes > max {
                return Err(ProviderError::LimitExceeded(format!(
                    "query scanned more than max_bytes = {max} bytes"
                )));
            }
        }
        if let Some(max) = self.max_duration {
            if elapsed > max {
                return Err(ProviderError::LimitExceeded(format!(
                    "query ran longer than max_duration {max:?}"
                )));
            }
        }
        Ok(())
    }
}
