//! Writing one segment, streamed: rows are encoded into a local spill file as they come,
//! then the payload is uploaded, verified by ranges, and only then is the manifest created.
//!
//! The compactor hands over the rows of a run of partitions in pieces
//! ([`SegmentWriter::push`]), sorted by `(partition_key, event_time, sort_key)`; the writer
//! holds at most one encode batch of them ([`ENCODE_BATCH_ROWS`]) and the row group being
//! encoded, so its memory does not depend on the size of a partition or a segment. A row
//! group is cut at a partition boundary once it holds [`GROUP_MIN_ROWS`] rows or
//! [`GROUP_MAX_BYTES`] bytes (small partitions share a group, a large one starts its own),
//! inside a partition every [`ROW_GROUP_ROWS`] rows or [`GROUP_MAX_BYTES`] bytes (a large
//! partition spans many groups). The encoded file goes to a spill directory
//! ([`SegmentUpload::spill_dir`]), unlinked as soon as it is created so that nothing is left
//! behind by a crash.
//!
//! While encoding, the writer records for every *slice* (one partition's rows in one row
//! group) its row count, its first and last `(event_time, sort_key)` (the manifest v6
//! bounds) and a SHA-256 of its logical rows ([`hash_row`]). `finish` (in `upload.rs`)
//! computes the payload's digests from the spill file, uploads it (one create-once PUT, or a
//! multipart upload under a unique key for a large payload), reads it back by ranges for
//! its SHA-256, decodes every slice through the reader queries use and compares it with the
//! recorded digest, and only then creates the manifest: a manifest key this module returns
//! names a segment known to hold exactly the rows handed in.

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;
use std::sync::Arc;

use parquet::arrow::ArrowWriter;
use parquet::file::metadata::SortingColumn;
use sha2::{Digest, Sha256};

use super::manifest::PartitionEntry;
use super::upload;
use crate::archive::parquet::{writer_properties, ValueColumns, ENCODE_BATCH_ROWS, ROW_GROUP_ROWS};
use crate::archive::{ArchiveError, ArchiveStore};
use crate::model::envelope::{COL_PARTITION, COL_SORT, COL_TIME};
use crate::model::{
    envelope_schema, records_to_batch, BucketKey, BucketStrategy, EventTime, Record, SortKey,
    TableId,
};

/// A row group is closed at the next partition boundary once it holds this many rows, so
/// small partitions share groups and a partition's read is one or two groups.
pub const GROUP_MIN_ROWS: usize = 4 * 1024;
/// ... or once its encoded size reaches this, so one group stays one modest ranged read.
pub const GROUP_MAX_BYTES: usize = 8 << 20;
/// Rows are encoded once this many bytes of them are pending (or [`ENCODE_BATCH_ROWS`]
/// rows, whichever comes first): with large values a batch of rows alone would be hundreds
/// of MiB, and a group would pass [`GROUP_MAX_BYTES`] by as much before its size is checked.
pub const PENDING_MAX_BYTES: usize = 1 << 20;

/// What one segment is: its table, window and place, and the compaction that writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSpec {
    /// The table.
    pub table_id: TableId,
    /// The table's bucket strategy.
    pub strategy: BucketStrategy,
    /// The window (a bucket of `strategy.window_strategy()`).
    pub window: BucketKey,
    /// The compaction claim's generation.
    pub generation: i64,
    /// The segment's place among the window's segments of this generation.
    pub ordinal: u32,
}

/// Where a segment's payload is encoded and how it is uploaded (the archiver's
/// `ARCHIVER_SPILL_DIR`, `ARCHIVER_SEGMENT_PUT_MAX_BYTES` and
/// `ARCHIVER_SEGMENT_PART_BYTES`, see `docs/settings.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentUpload {
    /// Directory of the spill file the payload is encoded into (`None`: the system's
    /// temporary directory). It needs room for one segment's payload.
    pub spill_dir: Option<PathBuf>,
    /// A payload up to this size is one create-once PUT (`If-None-Match: *`) at
    /// `payload.parquet`; a larger one is a multipart upload at a key made unique by a
    /// random nonce (`payload-<nonce>.parquet`), since radosgw ignores the condition on
    /// multipart completion.
    pub put_max_bytes: u64,
    /// Part size of multipart uploads, and of the ranged reads that verify a payload.
    pub part_bytes: usize,
}

/// Default [`SegmentUpload::put_max_bytes`].
pub const SEGMENT_PUT_MAX_BYTES: u64 = 16 << 20;
/// Default [`SegmentUpload::part_bytes`].
pub const SEGMENT_PART_BYTES: usize = 16 << 20;

impl Default for SegmentUpload {
    fn default() -> Self {
        Self {
            spill_dir: None,
            put_max_bytes: SEGMENT_PUT_MAX_BYTES,
            part_bytes: SEGMENT_PART_BYTES,
        }
    }
}

/// A written, verified segment.
#[derive(Debug, Clone)]
pub struct WrittenSegment {
    /// Key of its manifest (what routes will name).
    pub manifest_key: String,
    /// The manifest as stored.
    pub manifest: Arc<crate::archive::SegmentManifest>,
}

pub(super) fn invalid(spec: &SegmentSpec, reason: String) -> ArchiveError {
    ArchiveError::InvalidInput {
        bucket: format!(
            "{} segment {} of {}",
            spec.table_id, spec.ordinal, spec.window
        ),
        reason,
    }
}

/// The canonical encoding of one logical row that slice digests are computed over: each
/// byte string length-prefixed (u32 little-endian), the time as nanoseconds (i64 LE). The
/// writer hashes the rows handed in, the verification the rows decoded from the store.
pub(super) fn hash_row(h: &mut Sha256, pk: &[u8], nanos: i64, sk: &[u8], value: &[u8]) {
    for b in [pk, &nanos.to_le_bytes()[..], sk, value] {
        h.update((b.len() as u32).to_le_bytes());
        h.update(b);
    }
}

/// One partition's rows in one row group, as handed in: what the manifest's bounds say and
/// what the decoded rows must hash to.
#[derive(Debug, Clone)]
pub(super) struct SliceDigest {
    pub rows: u64,
    pub first: (EventTime, SortKey),
    pub last: (EventTime, SortKey),
    pub sha256: [u8; 32],
}

struct OpenSlice {
    hasher: Sha256,
    rows: u64,
    first: (EventTime, SortKey),
    last: (EventTime, SortKey),
}

/// A segment being written: rows go in with [`Self::push`], [`Self::finish`] uploads and
/// verifies it and creates its manifest. Dropping it abandons the segment (nothing has been
/// uploaded before `finish`; the spill file is already unlinked).
pub struct SegmentWriter {
    store: ArchiveStore,
    spec: SegmentSpec,
    upload: SegmentUpload,
    spill_dir: PathBuf,
    writer: Option<ArrowWriter<BufWriter<File>>>,
    /// Rows of the current partition not yet encoded (at most [`ENCODE_BATCH_ROWS`], and
    /// [`PENDING_MAX_BYTES`] plus one row).
    pending: Vec<Record>,
    /// Key and value bytes of `pending`.
    pending_bytes: usize,
    /// Clustering key of the last row encoded (order is checked across pieces).
    last: Option<(crate::model::PartitionKey, EventTime, SortKey)>,
    parts: Vec<PartitionEntry>,
    slices: Vec<SliceDigest>,
    current: Option<OpenSlice>,
    /// Rows in the row group being encoded, and in each one closed.
    group_rows: usize,
    groups: Vec<u64>,
    rows: u64,
    bytes: u64,
    /// Test hook (`ArchiveStore::with_lossy_encoder`): the first row encoded gets a value
    /// other than the one handed in (and hashed).
    lossy: bool,
    /// A declared table's columnar layout (record schema 3), or the binary envelope.
    layout: Option<ValueColumns>,
}

impl SegmentWriter {
    pub(crate) fn new(
        store: &ArchiveStore,
        spec: &SegmentSpec,
        upload: &SegmentUpload,
        layout: Option<ValueColumns>,
    ) -> Result<Self, ArchiveError> {
        if spec.window.strategy() != spec.strategy.window_strategy() {
            return Err(invalid(
                spec,
                format!(
                    "window {} is not a window of {}",
                    spec.window, spec.strategy
                ),
            ));
        }
        if spec.generation < 0 {
            return Err(invalid(
                spec,
                format!("negative generation {}", spec.generation),
            ));
        }
        if upload.part_bytes < 1 << 20 {
            return Err(ArchiveError::Config(format!(
                "segment part size {} is below 1 MiB",
                upload.part_bytes
            )));
        }
        let spill_dir = upload.spill_dir.clone().unwrap_or_else(std::env::temp_dir);
        let file = upload::spill_file(&spill_dir)?;
        // Row groups are cut here, never by the Parquet writer, so that every slice's digest
        // and bounds are known exactly.
        let props = writer_properties(ROW_GROUP_ROWS)
            .into_builder()
            .set_max_row_group_row_count(None)
            .set_sorting_columns(Some(
                [COL_PARTITION, COL_TIME, COL_SORT]
                    .into_iter()
                    .map(|c| SortingColumn {
                        column_idx: c as i32,
                        descending: false,
                        nulls_first: false,
                    })
                    .collect(),
            ))
            .build();
        let schema = layout
            .as_ref()
            .map_or_else(|| envelope_schema(true), ValueColumns::payload_schema);
        let writer =
            ArrowWriter::try_new(BufWriter::with_capacity(1 << 20, file), schema, Some(props))
                .map_err(|e| invalid(spec, format!("encoding: {e}")))?;
        Ok(Self {
            store: store.clone(),
            spec: spec.clone(),
            upload: upload.clone(),
            spill_dir,
            writer: Some(writer),
            pending: Vec::with_capacity(ENCODE_BATCH_ROWS),
            pending_bytes: 0,
            last: None,
            parts: Vec::new(),
            slices: Vec::new(),
            current: None,
            group_rows: 0,
            groups: Vec::new(),
            rows: 0,
            bytes: 0,
            lossy: store.lossy_encoder(),
            layout,
        })
    }

    /// Rows handed in so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Uncompressed bytes handed in so far (key and value bytes, as the segment target
    /// counts them).
    pub fn input_bytes(&self) -> u64 {
        self.bytes
    }

    /// Partitions begun so far.
    pub fn partitions(&self) -> usize {
        self.parts.len()
    }

    /// Adds rows, which must continue the strictly increasing `(partition_key, event_time,
    /// sort_key)` order of every row before them and lie in the window.
    pub fn push(&mut self, records: Vec<Record>) -> Result<(), ArchiveError> {
        for r in records {
            self.push_one(r)?;
        }
        Ok(())
    }

    fn push_one(&mut self, r: Record) -> Result<(), ArchiveError> {
        let n = self.rows;
        if !self.spec.window.contains(r.event_time) {
            return Err(invalid(
                &self.spec,
                format!("row {n} at {} is outside the window", r.event_time),
            ));
        }
        let before = match (self.pending.last(), &self.last) {
            (Some(p), _) => Some((
                p.partition_key.as_bytes(),
                p.event_time,
                p.sort_key.as_bytes(),
            )),
            (None, Some((pk, t, sk))) => Some((pk.as_bytes(), *t, sk.as_bytes())),
            (None, None) => None,
        };
        if let Some(prev) = before {
            if prev
                >= (
                    r.partition_key.as_bytes(),
                    r.event_time,
                    r.sort_key.as_bytes(),
                )
            {
                return Err(invalid(
                    &self.spec,
                    format!("row {n} is not after row {}", n.saturating_sub(1)),
                ));
            }
        }
        let new_partition = self
            .parts
            .last()
            .is_none_or(|p| p.partition_key != r.partition_key);
        if new_partition {
            self.write_pending()?;
            self.close_slice();
            let w = self.writer.as_ref().expect("open until finish");
            if self.group_rows > 0
                && (w.in_progress_rows() >= GROUP_MIN_ROWS
                    || w.in_progress_size() >= GROUP_MAX_BYTES)
            {
                self.cut()?;
            }
            self.parts.push(PartitionEntry {
                partition_key: r.partition_key.clone(),
                first_row: self.rows,
                rows: 0,
                buckets: Vec::new(),
                slices: Vec::new(),
            });
        }
        let bucket = self.spec.strategy.bucket_of(r.event_time);
        let p = self.parts.last_mut().expect("a partition is open");
        p.rows += 1;
        match p.buckets.last_mut() {
            Some((k, c)) if *k == bucket => *c += 1,
            _ => p.buckets.push((bucket, 1)),
        }
        self.rows += 1;
        let size =
            r.partition_key.as_bytes().len() + 8 + r.sort_key.as_bytes().len() + r.value.len();
        self.bytes += size as u64;
        self.pending_bytes += size;
        self.pending.push(r);
        if self.pending.len() >= ENCODE_BATCH_ROWS || self.pending_bytes >= PENDING_MAX_BYTES {
            self.write_pending()?;
        }
        Ok(())
    }

    fn fail(&self, e: parquet::errors::ParquetError) -> ArchiveError {
        invalid(&self.spec, format!("encoding: {e}"))
    }

    /// Encodes the pending rows (all of one partition), cutting a row group every
    /// [`ROW_GROUP_ROWS`] rows and once the group reaches [`GROUP_MAX_BYTES`].
    fn write_pending(&mut self) -> Result<(), ArchiveError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        let mut at = 0;
        while at < chunk.len() {
            let room = ROW_GROUP_ROWS - self.group_rows;
            let piece = &chunk[at..at + room.min(chunk.len() - at)];
            self.digest(piece);
            let batch = if self.lossy {
                // Test hook: the encoder silently alters one value. Row counts and keys stay
                // right, so the manifest is consistent and only the slice digests can tell.
                self.lossy = false;
                let mut v = piece.to_vec();
                v[0].value.push(b'!');
                records_to_batch(&v, true)
            } else {
                records_to_batch(piece, true)
            };
            let batch = match &self.layout {
                Some(l) => l.to_payload(&batch)?,
                None => batch,
            };
            let w = self.writer.as_mut().expect("open until finish");
            w.write(&batch).map_err(|e| self.fail(e))?;
            self.group_rows += piece.len();
            at += piece.len();
            let w = self.writer.as_ref().expect("open until finish");
            if self.group_rows == ROW_GROUP_ROWS || w.in_progress_size() >= GROUP_MAX_BYTES {
                self.cut()?;
            }
        }
        let l = chunk.last().expect("not empty");
        self.last = Some((l.partition_key.clone(), l.event_time, l.sort_key.clone()));
        self.pending = chunk;
        self.pending.clear();
        Ok(())
    }

    /// Adds rows (one partition's, inside one row group) to the open slice.
    fn digest(&mut self, rows: &[Record]) {
        let (Some(f), Some(l)) = (rows.first(), rows.last()) else {
            return;
        };
        let s = self.current.get_or_insert_with(|| OpenSlice {
            hasher: Sha256::new(),
            rows: 0,
            first: (f.event_time, f.sort_key.clone()),
            last: (f.event_time, f.sort_key.clone()),
        });
        for r in rows {
            hash_row(
                &mut s.hasher,
                r.partition_key.as_bytes(),
                r.event_time.as_nanos(),
                r.sort_key.as_bytes(),
                &r.value,
            );
        }
        s.rows += rows.len() as u64;
        s.last = (l.event_time, l.sort_key.clone());
    }

    fn close_slice(&mut self) {
        if let Some(s) = self.current.take() {
            self.slices.push(SliceDigest {
                rows: s.rows,
                first: s.first,
                last: s.last,
                sha256: s.hasher.finalize().into(),
            });
        }
    }

    /// Closes the row group being encoded.
    fn cut(&mut self) -> Result<(), ArchiveError> {
        self.close_slice();
        let w = self.writer.as_mut().expect("open until finish");
        w.flush().map_err(|e| self.fail(e))?;
        self.groups.push(self.group_rows as u64);
        self.group_rows = 0;
        Ok(())
    }

    /// Encodes the rest, then uploads, verifies and commits the segment (see the module
    /// comment). Returns only when all of that succeeded; transient storage failures are
    /// retried request by request.
    pub async fn finish(mut self) -> Result<WrittenSegment, ArchiveError> {
        self.write_pending()?;
        self.close_slice();
        if self.rows == 0 {
            return Err(invalid(
                &self.spec,
                "a segment needs at least one row".into(),
            ));
        }
        if self.group_rows > 0 {
            self.cut()?;
        }
        let spill_err = |dir: &PathBuf, e: std::io::Error| ArchiveError::Spill {
            dir: dir.display().to_string(),
            source: e,
        };
        let w = self.writer.take().expect("open until finish");
        let buffered = w.into_inner().map_err(|e| self.fail(e))?;
        let file = buffered
            .into_inner()
            .map_err(|e| spill_err(&self.spill_dir, e.into_error()))?;
        upload::commit(upload::Encoded {
            store: self.store,
            spec: self.spec,
            upload: self.upload,
            spill_dir: self.spill_dir,
            file,
            parts: self.parts,
            slices: self.slices,
            groups: self.groups,
            rows: self.rows,
            table_schema_version: self.layout.as_ref().map(ValueColumns::table_schema_version),
        })
        .await
    }
}

/// [`SegmentWriter`] over rows held by the caller, with the default upload settings (the
/// public `ArchiveStore::write_segment`).
pub(crate) async fn write_segment(
    store: &ArchiveStore,
    spec: &SegmentSpec,
    records: &[Record],
) -> Result<WrittenSegment, ArchiveError> {
    let mut w = SegmentWriter::new(store, spec, &SegmentUpload::default(), None)?;
    for chunk in records.chunks(ENCODE_BATCH_ROWS) {
        w.push(chunk.to_vec())?;
    }
    w.finish().await
}
