//! Writing one segment: encode, create once, read back, verify, then the manifest.
//!
//! The compactor hands over the rows of a run of partitions, already verified against their
//! source archives and sorted by `(partition_key, event_time, sort_key)`. They are encoded
//! in memory (a segment is bounded by the target size), with a row group cut at a partition
//! boundary once the group holds [`GROUP_MIN_ROWS`] rows or [`GROUP_MAX_BYTES`] bytes, so a
//! small partition shares a group and a large one starts its own. The payload is created
//! with create-if-absent in one PUT, read back whole and compared by SHA-256, and then every
//! partition is read again through the reader queries use (ranged reads of the footer and
//! of each of its row groups, each checked against its digest) and compared, row for row,
//! with the rows handed in. Only then is the
//! manifest created (one conditional PUT, read back and parsed): a manifest key that this
//! function returns names a segment that is known to hold exactly those rows.

use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::{ParquetMetaDataReader, SortingColumn};

use super::manifest::{
    segment_dir, slices_of, ByteRange, PartitionEntry, RowGroupEntry, SegmentManifest,
    SEGMENT_MANIFEST_VERSION,
};
use super::pruned::slice_rows;
use super::read::SegmentCache;
use crate::archive::integrity::sha256_hex;
use crate::archive::parquet::{writer_properties, ENCODE_BATCH_ROWS, ROW_GROUP_ROWS};
use crate::archive::write::is_condition_failure;
use crate::archive::{retry_transient, ArchiveError, ArchiveScanMetrics, ArchiveStore};
use crate::model::envelope::{COL_PARTITION, COL_SORT, COL_TIME};
use crate::model::{
    batch_to_records, envelope_schema, records_to_batch, BucketKey, BucketStrategy, Record, TableId,
};

/// A row group is closed at the next partition boundary once it holds this many rows, so
/// small partitions share groups and a partition's read is one or two groups.
pub const GROUP_MIN_ROWS: usize = 4 * 1024;
/// ... or once its encoded size reaches this, so one group stays one modest ranged read.
pub const GROUP_MAX_BYTES: usize = 8 << 20;

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

/// A written, verified segment.
#[derive(Debug, Clone)]
pub struct WrittenSegment {
    /// Key of its manifest (what routes will name).
    pub manifest_key: String,
    /// The manifest as stored.
    pub manifest: Arc<SegmentManifest>,
}

fn invalid(spec: &SegmentSpec, reason: String) -> ArchiveError {
    ArchiveError::InvalidInput {
        bucket: format!(
            "{} segment {} of {}",
            spec.table_id, spec.ordinal, spec.window
        ),
        reason,
    }
}

/// Rows in the window, non-empty, strictly increasing by `(partition, time, sort key)`.
fn check_input(spec: &SegmentSpec, records: &[Record]) -> Result<(), ArchiveError> {
    if records.is_empty() {
        return Err(invalid(spec, "a segment needs at least one row".into()));
    }
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
    for (i, r) in records.iter().enumerate() {
        if !spec.window.contains(r.event_time) {
            return Err(invalid(
                spec,
                format!("row {i} at {} is outside the window", r.event_time),
            ));
        }
        if i > 0 {
            let p = &records[i - 1];
            let a = (
                p.partition_key.as_bytes(),
                p.event_time,
                p.sort_key.as_bytes(),
            );
            let b = (
                r.partition_key.as_bytes(),
                r.event_time,
                r.sort_key.as_bytes(),
            );
            if a >= b {
                return Err(invalid(spec, format!("row {i} is not after row {}", i - 1)));
            }
        }
    }
    Ok(())
}

/// The partitions of sorted rows, with their buckets.
fn partitions(strategy: BucketStrategy, records: &[Record]) -> Vec<(PartitionEntry, usize)> {
    let mut out: Vec<(PartitionEntry, usize)> = Vec::new();
    for (i, r) in records.iter().enumerate() {
        let bucket = strategy.bucket_of(r.event_time);
        match out.last_mut() {
            Some((p, _)) if p.partition_key == r.partition_key => {
                p.rows += 1;
                match p.buckets.last_mut() {
                    Some((k, n)) if *k == bucket => *n += 1,
                    _ => p.buckets.push((bucket, 1)),
                }
            }
            _ => out.push((
                PartitionEntry {
                    partition_key: r.partition_key.clone(),
                    first_row: i as u64,
                    rows: 1,
                    buckets: vec![(bucket, 1)],
                    slices: Vec::new(),
                },
                i,
            )),
        }
    }
    out
}

/// Encodes sorted rows, cutting row groups at partition boundaries.
fn encode(
    spec: &SegmentSpec,
    records: &[Record],
    parts: &[(PartitionEntry, usize)],
    lossy: bool,
) -> Result<Vec<u8>, ArchiveError> {
    let props = writer_properties(ROW_GROUP_ROWS)
        .into_builder()
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
    let fail = |e: parquet::errors::ParquetError| invalid(spec, format!("encoding: {e}"));
    let mut w =
        ArrowWriter::try_new(Vec::new(), envelope_schema(true), Some(props)).map_err(fail)?;
    for (n, (p, start)) in parts.iter().enumerate() {
        if w.in_progress_rows() >= GROUP_MIN_ROWS || w.in_progress_size() >= GROUP_MAX_BYTES {
            w.flush().map_err(fail)?;
        }
        let mut rows = &records[*start..*start + p.rows as usize];
        let altered: Vec<Record>;
        if lossy && n == 0 {
            // Test hook: the encoder silently alters one value of the first partition. Row
            // counts and keys stay right, so the manifest is consistent and only the
            // writer's decoded comparison can tell.
            let mut v = rows.to_vec();
            let mid = v.len() / 2;
            v[mid].value.push(b'!');
            altered = v;
            rows = &altered;
        }
        for chunk in rows.chunks(ENCODE_BATCH_ROWS) {
            w.write(&records_to_batch(chunk, true)).map_err(fail)?;
            if w.in_progress_size() >= GROUP_MAX_BYTES {
                w.flush().map_err(fail)?;
            }
        }
    }
    // Writes the footer and hands back the buffer.
    w.into_inner().map_err(fail)
}

/// Row groups' byte ranges and the tail, read from the encoded file's own footer.
fn layout(key: &str, bytes: &Bytes) -> Result<(Vec<RowGroupEntry>, ByteRange), ArchiveError> {
    let meta = ParquetMetaDataReader::new()
        .parse_and_finish(bytes)
        .map_err(|e| ArchiveError::decode(key, e))?;
    let mut groups = Vec::with_capacity(meta.num_row_groups());
    let mut end = 4u64;
    for rg in meta.row_groups() {
        let (mut from, mut to) = (u64::MAX, 0u64);
        for c in rg.columns() {
            let (o, n) = c.byte_range();
            from = from.min(o);
            to = to.max(o + n);
        }
        if from < end || to <= from {
            return Err(ArchiveError::decode(key, "row groups overlap or are empty"));
        }
        end = to;
        let slice = &bytes[from as usize..to as usize];
        groups.push(RowGroupEntry {
            range: ByteRange {
                offset: from,
                length: to - from,
                sha256: sha256_hex(slice),
            },
            rows: rg.num_rows() as u64,
        });
    }
    let tail = &bytes[end as usize..];
    Ok((
        groups,
        ByteRange {
            offset: end,
            length: tail.len() as u64,
            sha256: sha256_hex(tail),
        },
    ))
}

/// Creates `bytes` at `key` once; an object already there must hold the same bytes. A
/// transient failure is retried: a create that did commit is then found and compared.
async fn create_once(op: &opendal::Operator, key: &str, bytes: Bytes) -> Result<(), ArchiveError> {
    let mut attempt = 0;
    loop {
        let e = match op.write_with(key, bytes.clone()).if_not_exists(true).await {
            Ok(_) => return Ok(()),
            Err(e) if is_condition_failure(&e) => {
                let stored = read(op, key).await?;
                if stored != bytes {
                    return Err(ArchiveError::AlreadyExistsDifferent {
                        key: key.to_string(),
                    });
                }
                return Ok(());
            }
            Err(e) => ArchiveError::storage("write", key, e),
        };
        if !retry_transient(&e, &mut attempt).await {
            return Err(e);
        }
    }
}

/// A whole object, transient failures retried.
async fn read(op: &opendal::Operator, key: &str) -> Result<Bytes, ArchiveError> {
    let mut attempt = 0;
    loop {
        let e = match op.read(key).await {
            Ok(b) => return Ok(b.to_bytes()),
            Err(e) => ArchiveError::storage("read", key, e),
        };
        if !retry_transient(&e, &mut attempt).await {
            return Err(e);
        }
    }
}

pub(crate) async fn write_segment(
    store: &ArchiveStore,
    spec: &SegmentSpec,
    records: &[Record],
) -> Result<WrittenSegment, ArchiveError> {
    check_input(spec, records)?;
    let dir = store.rooted(&segment_dir(
        &spec.table_id,
        &spec.window,
        spec.ordinal,
        spec.generation,
    ));
    let payload_key = format!("{dir}/payload.parquet");
    let manifest_key = format!("{dir}/manifest.json");
    let parts = partitions(spec.strategy, records);
    let encoded = Bytes::from(encode(spec, records, &parts, store.lossy_encoder())?);
    let (row_groups, footer) = layout(&payload_key, &encoded)?;
    let mut parts = parts;
    for (p, start) in &mut parts {
        p.slices = slices_of(&row_groups, p.first_row, p.rows);
        let mut at = *start;
        for g in &mut p.slices {
            let (f, l) = (&records[at], &records[at + g.rows as usize - 1]);
            g.bounds = Some((
                (f.event_time, f.sort_key.clone()),
                (l.event_time, l.sort_key.clone()),
            ));
            at += g.rows as usize;
        }
    }
    let now = Utc::now();
    let manifest = SegmentManifest {
        version: SEGMENT_MANIFEST_VERSION,
        table_id: spec.table_id.clone(),
        bucket_strategy: spec.strategy,
        window: spec.window,
        generation: spec.generation,
        ordinal: spec.ordinal,
        payload_key: payload_key.clone(),
        row_count: records.len() as u64,
        byte_length: encoded.len() as u64,
        sha256: sha256_hex(&encoded),
        footer,
        row_groups,
        partitions: parts.iter().map(|(p, _)| p.clone()).collect(),
        created_at: DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now),
    };
    // The manifest must be one a reader accepts before anything is written.
    let manifest_bytes = manifest.to_json_bytes();
    SegmentManifest::parse(&manifest_bytes, &manifest_key)?;

    let op = store.operator();
    create_once(op, &payload_key, encoded.clone()).await?;
    crate::failpoint::hit("segment_after_payload");
    // Read back: the stored object must be the encoded bytes, then it must decode to the
    // rows handed in, partition by partition, through the reader queries use.
    let stored = read(op, &payload_key).await?;
    if stored.len() as u64 != manifest.byte_length {
        return Err(ArchiveError::LengthMismatch {
            key: payload_key,
            expected: manifest.byte_length,
            actual: stored.len() as u64,
        });
    }
    let actual = sha256_hex(&stored);
    if actual != manifest.sha256 {
        return Err(ArchiveError::ChecksumMismatch {
            key: payload_key,
            expected: manifest.sha256.clone(),
            actual,
        });
    }
    drop(stored);
    verify_decoded(op, &manifest, records, &parts).await?;

    match create_once(op, &manifest_key, Bytes::from(manifest_bytes)).await {
        Ok(()) => {}
        // A retry of the same generation wrote the manifest first, with another created_at.
        Err(ArchiveError::AlreadyExistsDifferent { .. }) => {
            let existing = SegmentManifest::parse(&read(op, &manifest_key).await?, &manifest_key)?;
            let mut mine = manifest.clone();
            mine.created_at = existing.created_at;
            if mine != existing {
                return Err(ArchiveError::AlreadyExistsDifferent { key: manifest_key });
            }
        }
        Err(e) => return Err(e),
    }
    let back = SegmentManifest::parse(&read(op, &manifest_key).await?, &manifest_key)?;
    let mut mine = manifest;
    mine.created_at = back.created_at;
    if mine != back {
        return Err(ArchiveError::InvalidManifest {
            key: manifest_key,
            reason: "read-back manifest differs from the one written".into(),
        });
    }
    crate::failpoint::hit("segment_after_manifest");
    Ok(WrittenSegment {
        manifest_key,
        manifest: Arc::new(back),
    })
}

/// Decodes every partition of the stored payload through the reader queries use (the
/// footer and each row group fetched with its own ranged read and checked against its
/// digest, each group cut to the partition's rows and checked against the manifest's
/// bounds, nothing cached) and compares it with the rows the segment was written from.
/// Checking the whole file as one buffer would pass a payload whose ranged reads cannot be
/// decoded (a partition spanning row groups once was one). Memory holds one row group.
async fn verify_decoded(
    op: &opendal::Operator,
    m: &SegmentManifest,
    records: &[Record],
    parts: &[(PartitionEntry, usize)],
) -> Result<(), ArchiveError> {
    let key = m.payload_key.as_str();
    let cache = SegmentCache::with_partition_bytes(0);
    let metrics = ArchiveScanMetrics::default();
    for (p, start) in parts {
        let mut at = *start;
        for g in &p.slices {
            // Each group's reads are retried on their own (a transient failure of one
            // ranged read should not restart the whole segment).
            let mut attempt = 0;
            let batch = loop {
                match slice_rows(op, &cache, m, p, g, &metrics).await {
                    Err(e) if retry_transient(&e, &mut attempt).await => {}
                    other => break other?,
                }
            };
            let decoded = batch_to_records(&batch)?;
            let want = &records[at..at + g.rows as usize];
            at += g.rows as usize;
            if decoded.len() != want.len() {
                return Err(ArchiveError::RowCountMismatch {
                    key: key.to_string(),
                    expected: want.len() as u64,
                    actual: decoded.len() as u64,
                });
            }
            if decoded.as_slice() != want {
                return Err(ArchiveError::decode(
                    key,
                    format!(
                        "partition {} decodes to rows that differ from the rows written \
                         (row group {})",
                        p.partition_key.to_hex(),
                        g.row_group
                    ),
                ));
            }
        }
    }
    Ok(())
}
