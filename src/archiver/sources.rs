//! The sources a compaction reads: each bucket's rows from the object its route names (a
//! per-bucket archive or an older segment), opened, verified and streamed as every read
//! is, with the bucket's row masks applied on the way (edits and deletes of archived rows
//! are written into the segment, so the masks can be marked purged once it is switched).
//! [`super::compact`] runs the window pass and writes the segments from these.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use futures::stream::BoxStream;
use futures::StreamExt;

use crate::archive::{ArchiveError, ArchiveScan, ArchiveStore, RouteManifest, SegmentWriter};
use crate::model::{batch_to_records, EventTime, Record};
use crate::store::{CompactionSource, RowMask};

use super::ArchiverError;

/// Rows of one source, streamed.
pub(super) type SourceRows = BoxStream<'static, Result<RecordBatch, ArchiveError>>;

/// Opens one source bucket for a verified, streamed read (per-bucket archive or segment):
/// its rows, and how many its manifest says it holds.
pub(super) async fn read_source(
    archive: &ArchiveStore,
    source: &CompactionSource,
) -> Result<(SourceRows, u64), ArchiverError> {
    // Each request is retried on its own, so a retry never repeats one that succeeded.
    // A segment's manifest is opened once per store: `open_route` keeps it.
    let mut attempt = 0;
    let route = loop {
        match archive.open_route(&source.object_key, &source.bucket).await {
            Err(e) if crate::archive::retry_transient(&e, &mut attempt).await => {}
            other => break other?,
        }
    };
    let expected = match &route {
        RouteManifest::Bucket(m) => m.row_count,
        RouteManifest::Segment(m) => m.entry_for(&m.payload_key, &source.bucket)?.1,
    };
    let req = ArchiveScan::default();
    let mut attempt = 0;
    loop {
        match archive
            .scan_route(&route, &source.bucket, &req, Arc::default())
            .await
        {
            Err(e) if crate::archive::retry_transient(&e, &mut attempt).await => {}
            other => return Ok((other?, expected)),
        }
    }
}

/// Streams one opened source into the segment writer, checking that every row is the
/// source bucket's; returns the rows read. (Verification of the bytes is the scan's: every
/// block or row group against its digest, row counts against the manifest.)
pub(super) async fn stream_source(
    mut rows: SourceRows,
    source: &CompactionSource,
    masks: &Masks,
    writer: &mut SegmentWriter,
) -> Result<(u64, u64), ArchiverError> {
    let (mut n, mut kept) = (0u64, 0u64);
    while let Some(batch) = rows.next().await {
        let mut records = batch_to_records(&batch?).map_err(ArchiveError::from)?;
        if let Some(r) = records.iter().find(|r| {
            r.partition_key != source.bucket.partition_key
                || !source.bucket.bucket_key.contains(r.event_time)
        }) {
            return Err(ArchiverError::Unresolved {
                bucket: source.bucket.clone(),
                step: "compaction",
                detail: format!("its archive holds a row at {} outside it", r.event_time),
            });
        }
        n += records.len() as u64;
        masks.apply(&mut records);
        kept += records.len() as u64;
        writer.push(records)?;
    }
    Ok((n, kept))
}

/// One bucket's delete and edit records, by clustering key, applied to its rows as a
/// rewrite copies them: what a query reads is what the new segment holds.
pub(super) struct Masks(HashMap<(EventTime, Vec<u8>), Option<Vec<u8>>>);

impl Masks {
    pub(super) fn new(masks: &[RowMask]) -> Self {
        Self(
            masks
                .iter()
                .map(|m| {
                    (
                        (m.event_time, m.sort_key.as_bytes().to_vec()),
                        m.value.clone(),
                    )
                })
                .collect(),
        )
    }

    /// Drops deleted rows and replaces edited values.
    pub(super) fn apply(&self, records: &mut Vec<Record>) {
        if self.0.is_empty() {
            return;
        }
        records.retain_mut(
            |r| match self.0.get(&(r.event_time, r.sort_key.as_bytes().to_vec())) {
                None => true,
                Some(None) => false,
                Some(Some(v)) => {
                    r.value.clone_from(v);
                    true
                }
            },
        );
    }
}
