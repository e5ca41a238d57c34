//! The second half of a segment write: from the encoded spill file to a committed manifest.
//!
//! 1. Layout: the Parquet footer is read from the spill file, each row group's byte range
//!    taken from its column chunks, and the SHA-256 of the whole payload, of every row
//!    group and of the tail computed by reading the file (nothing is held whole).
//! 2. Upload: a payload up to [`SegmentUpload::put_max_bytes`] is one create-once PUT at
//!    `payload.parquet` (an existing object must hold the same bytes); a larger one is a
//!    multipart upload, part by part from the file, at `payload-<nonce>.parquet`. radosgw
//!    ignores `If-None-Match` on multipart completion, so create-once there comes from the
//!    key: a random 128-bit nonce no other writer can hold, recorded in the manifest. The
//!    manifest itself stays one conditional PUT.
//! 3. Verification by ranges: the stored length (stat), then the SHA-256 of the stored
//!    payload computed over ranged reads of [`SegmentUpload::part_bytes`], then every slice
//!    of every partition decoded through the reader queries use (`pruned::slice_rows`: the
//!    footer and the slice's row group each with its own ranged read checked against its
//!    digest, the rows checked against the manifest's bounds) and its logical rows hashed
//!    and compared with the digest the encoder recorded from the rows handed in. Memory
//!    holds one row group.
//! 4. Only then the manifest: one create-once PUT, read back and compared.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use datafusion::arrow::array::{Array, BinaryArray, TimestampNanosecondArray};
use datafusion::arrow::record_batch::RecordBatch;
use parquet::file::metadata::ParquetMetaDataReader;
use sha2::{Digest, Sha256};

use super::manifest::{
    segment_dir, slices_of, ByteRange, PartitionEntry, RowGroupEntry, SegmentManifest,
    SEGMENT_MANIFEST_VERSION,
};
use super::pruned::slice_rows;
use super::read::SegmentCache;
use super::write::{hash_row, invalid, SegmentSpec, SegmentUpload, SliceDigest, WrittenSegment};
use crate::archive::write::is_condition_failure;
use crate::archive::{retry_transient, ArchiveError, ArchiveScanMetrics, ArchiveStore};
use crate::model::envelope::{COL_PARTITION, COL_SORT, COL_TIME, COL_VALUE};

/// What the encoder hands over: the finished spill file and what it recorded.
pub(super) struct Encoded {
    pub store: ArchiveStore,
    pub spec: SegmentSpec,
    pub upload: SegmentUpload,
    pub spill_dir: PathBuf,
    pub file: File,
    pub parts: Vec<PartitionEntry>,
    pub slices: Vec<SliceDigest>,
    pub groups: Vec<u64>,
    pub rows: u64,
    /// The table schema version of a columnar payload.
    pub table_schema_version: Option<u32>,
}

/// A fresh spill file in `dir`, already unlinked: its space is freed when the writer drops
/// it, and a crash leaves nothing behind.
pub(super) fn spill_file(dir: &Path) -> Result<File, ArchiveError> {
    let err = |e| ArchiveError::Spill {
        dir: dir.display().to_string(),
        source: e,
    };
    let path = dir.join(format!("pulpitum-segment-{}.spill", nonce()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(err)?;
    std::fs::remove_file(&path).map_err(err)?;
    Ok(file)
}

/// Checks that a spill file can be created, written and removed in `dir` (a directory that
/// exists but refuses writes would fail every compaction); the error names the cause.
pub fn probe_spill_dir(dir: &Path) -> Result<(), ArchiveError> {
    use std::io::Write;
    let mut f = spill_file(dir)?;
    f.write_all(b"probe").map_err(|e| ArchiveError::Spill {
        dir: dir.display().to_string(),
        source: e,
    })
}

/// 128 random bits, hex.
fn nonce() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// `len` bytes of the spill file at `offset`.
fn read_at(file: &File, dir: &Path, offset: u64, len: usize) -> Result<Vec<u8>, ArchiveError> {
    let mut f = file;
    let mut buf = vec![0u8; len];
    f.seek(SeekFrom::Start(offset))
        .and_then(|_| f.read_exact(&mut buf))
        .map_err(|e| ArchiveError::Spill {
            dir: dir.display().to_string(),
            source: e,
        })?;
    Ok(buf)
}

/// SHA-256 of `from..to` of the spill file, read a MiB at a time.
fn digest_range(file: &File, dir: &Path, from: u64, to: u64) -> Result<String, ArchiveError> {
    let mut h = Sha256::new();
    let mut at = from;
    while at < to {
        let n = (to - at).min(1 << 20) as usize;
        h.update(read_at(file, dir, at, n)?);
        at += n as u64;
    }
    Ok(hex::encode(h.finalize()))
}

/// The payload's length, SHA-256, row groups (ranges, digests, rows) and tail, from the
/// spill file; the row groups must be the ones the encoder cut.
fn layout(
    e: &Encoded,
    key: &str,
) -> Result<(u64, String, Vec<RowGroupEntry>, ByteRange), ArchiveError> {
    let (file, dir) = (&e.file, e.spill_dir.as_path());
    let len = file
        .metadata()
        .map_err(|source| ArchiveError::Spill {
            dir: dir.display().to_string(),
            source,
        })?
        .len();
    if len < 12 {
        return Err(ArchiveError::decode(key, "encoded payload is too short"));
    }
    let trailer = read_at(file, dir, len - 8, 8)?;
    let footer_len = u32::from_le_bytes(trailer[..4].try_into().expect("4 bytes")) as u64;
    if &trailer[4..] != b"PAR1" || footer_len + 12 > len {
        return Err(ArchiveError::decode(key, "encoded payload has no footer"));
    }
    let footer = read_at(file, dir, len - 8 - footer_len, footer_len as usize)?;
    let meta = ParquetMetaDataReader::decode_metadata(&footer)
        .map_err(|err| ArchiveError::decode(key, err))?;
    let counts: Vec<u64> = meta
        .row_groups()
        .iter()
        .map(|g| g.num_rows() as u64)
        .collect();
    if counts != e.groups {
        return Err(ArchiveError::decode(
            key,
            format!(
                "the encoded file has row groups of {counts:?} rows, the encoder cut {:?}",
                e.groups
            ),
        ));
    }
    let mut groups = Vec::with_capacity(meta.num_row_groups());
    let mut end = 4u64;
    for rg in meta.row_groups() {
        let (mut from, mut to) = (u64::MAX, 0u64);
        for c in rg.columns() {
            let (o, n) = c.byte_range();
            from = from.min(o);
            to = to.max(o + n);
        }
        if from < end || to <= from || to > len {
            return Err(ArchiveError::decode(key, "row groups overlap or are empty"));
        }
        end = to;
        groups.push(RowGroupEntry {
            range: ByteRange {
                offset: from,
                length: to - from,
                sha256: digest_range(file, dir, from, to)?,
            },
            rows: rg.num_rows() as u64,
        });
    }
    let tail = ByteRange {
        offset: end,
        length: len - end,
        sha256: digest_range(file, dir, end, len)?,
    };
    Ok((len, digest_range(file, dir, 0, len)?, groups, tail))
}

/// Commits an encoded segment (see the module comment).
pub(super) async fn commit(mut e: Encoded) -> Result<WrittenSegment, ArchiveError> {
    let spec = e.spec.clone();
    let dir = e.store.rooted(&segment_dir(
        &spec.table_id,
        &spec.window,
        spec.ordinal,
        spec.generation,
    ));
    let manifest_key = format!("{dir}/manifest.json");
    let (len, sha256, row_groups, footer) = layout(&e, &format!("{dir}/payload.parquet"))?;
    let multipart = len > e.upload.put_max_bytes;
    let payload_key = if multipart {
        format!("{dir}/payload-{}.parquet", nonce())
    } else {
        format!("{dir}/payload.parquet")
    };
    // Each partition's slices, from the row groups, with the bounds the encoder recorded.
    let mut recorded = std::mem::take(&mut e.slices).into_iter();
    let mut digests: Vec<[u8; 32]> = Vec::new();
    for p in &mut e.parts {
        p.slices = slices_of(&row_groups, p.first_row, p.rows);
        for g in &mut p.slices {
            let Some(s) = recorded.next().filter(|s| s.rows == g.rows) else {
                return Err(invalid(
                    &spec,
                    "the encoder's slices do not match its row groups".into(),
                ));
            };
            g.bounds = Some((s.first, s.last));
            digests.push(s.sha256);
        }
    }
    if recorded.next().is_some() {
        return Err(invalid(
            &spec,
            "the encoder's slices do not match its row groups".into(),
        ));
    }
    let now = Utc::now();
    let manifest = SegmentManifest {
        version: SEGMENT_MANIFEST_VERSION,
        table_id: spec.table_id.clone(),
        bucket_strategy: spec.strategy,
        window: spec.window,
        generation: spec.generation,
        ordinal: spec.ordinal,
        table_schema_version: e.table_schema_version,
        payload_key: payload_key.clone(),
        row_count: e.rows,
        byte_length: len,
        sha256,
        footer,
        row_groups,
        partitions: std::mem::take(&mut e.parts),
        created_at: DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now),
    };
    // The manifest must be one a reader accepts before anything is written.
    let manifest_bytes = manifest.to_json_bytes();
    SegmentManifest::parse(&manifest_bytes, &manifest_key)?;

    let op = e.store.operator().clone();
    if multipart {
        upload_parts(&op, &payload_key, &e).await?;
    } else {
        let bytes = read_at(&e.file, &e.spill_dir, 0, len as usize)?;
        create_once(&op, &payload_key, Bytes::from(bytes)).await?;
    }
    drop(e.file);
    crate::failpoint::hit("segment_after_payload");
    verify_stored(&op, &manifest, e.upload.part_bytes).await?;
    verify_decoded(&op, &manifest, &digests).await?;
    commit_manifest(&op, manifest, &manifest_key, manifest_bytes).await
}

/// Uploads the spill file as a multipart upload (parts of `part_bytes`, read from the file
/// one at a time). The key is this writer's alone, so a failed attempt is aborted and the
/// whole upload retried at the same key.
async fn upload_parts(op: &opendal::Operator, key: &str, e: &Encoded) -> Result<(), ArchiveError> {
    let mut attempt = 0;
    loop {
        let err = match upload_once(op, key, e).await {
            Ok(()) => return Ok(()),
            Err(err) => err,
        };
        if !retry_transient(&err, &mut attempt).await {
            return Err(err);
        }
    }
}

async fn upload_once(op: &opendal::Operator, key: &str, e: &Encoded) -> Result<(), ArchiveError> {
    let len = e
        .file
        .metadata()
        .map_err(|source| ArchiveError::Spill {
            dir: e.spill_dir.display().to_string(),
            source,
        })?
        .len();
    let part = e.upload.part_bytes;
    let mut w = op
        .writer_with(key)
        .chunk(part)
        .await
        .map_err(|err| ArchiveError::storage("write", key, err))?;
    let mut at = 0u64;
    let result: Result<(), ArchiveError> = async {
        while at < len {
            let n = (len - at).min(part as u64) as usize;
            let buf = read_at(&e.file, &e.spill_dir, at, n)?;
            w.write(buf)
                .await
                .map_err(|err| ArchiveError::storage("write", key, err))?;
            at += n as u64;
        }
        w.close()
            .await
            .map_err(|err| ArchiveError::storage("write", key, err))?;
        Ok(())
    }
    .await;
    if result.is_err() {
        // No multipart upload is left open to be billed; a filesystem cannot abort a file
        // written in place, and the key is this writer's own, so it is removed.
        match w.abort().await {
            Ok(()) => {}
            Err(_) => {
                if let Err(err) = op.delete(key).await {
                    tracing::warn!(key, error = %err, "could not remove a partial segment payload");
                }
            }
        }
    }
    result
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

/// A whole (small) object, transient failures retried.
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

/// The stored payload has the encoded length and SHA-256, computed over ranged reads of
/// `chunk` bytes (each retried on its own).
async fn verify_stored(
    op: &opendal::Operator,
    m: &SegmentManifest,
    chunk: usize,
) -> Result<(), ArchiveError> {
    let key = m.payload_key.as_str();
    let mut attempt = 0;
    let stored = loop {
        match op.stat(key).await {
            Ok(meta) => break meta.content_length(),
            Err(err) => {
                let err = ArchiveError::storage("stat", key, err);
                if !retry_transient(&err, &mut attempt).await {
                    return Err(err);
                }
            }
        }
    };
    if stored != m.byte_length {
        return Err(ArchiveError::LengthMismatch {
            key: key.to_string(),
            expected: m.byte_length,
            actual: stored,
        });
    }
    let mut h = Sha256::new();
    let mut at = 0u64;
    while at < m.byte_length {
        let to = (at + chunk as u64).min(m.byte_length);
        let mut attempt = 0;
        let bytes = loop {
            match op.read_with(key).range(at..to).await {
                Ok(b) => break b.to_bytes(),
                Err(err) => {
                    let err = ArchiveError::storage("read", key, err);
                    if !retry_transient(&err, &mut attempt).await {
                        return Err(err);
                    }
                }
            }
        };
        if bytes.len() as u64 != to - at {
            return Err(ArchiveError::Truncated {
                key: key.to_string(),
                reason: format!("a read of {at}..{to} returned {} bytes", bytes.len()),
            });
        }
        h.update(&bytes);
        at = to;
    }
    let actual = hex::encode(h.finalize());
    if actual != m.sha256 {
        return Err(ArchiveError::ChecksumMismatch {
            key: key.to_string(),
            expected: m.sha256.clone(),
            actual,
        });
    }
    Ok(())
}

/// The digest of decoded rows, as [`hash_row`] computes it for rows handed in.
fn batch_digest(key: &str, b: &RecordBatch) -> Result<[u8; 32], ArchiveError> {
    let bin = |i: usize| -> Result<&BinaryArray, ArchiveError> {
        b.column(i)
            .as_any()
            .downcast_ref::<BinaryArray>()
            .filter(|a| a.null_count() == 0)
            .ok_or_else(|| ArchiveError::decode(key, format!("column {i} is not Binary")))
    };
    let (pk, sk, v) = (bin(COL_PARTITION)?, bin(COL_SORT)?, bin(COL_VALUE)?);
    let t = b
        .column(COL_TIME)
        .as_any()
        .downcast_ref::<TimestampNanosecondArray>()
        .filter(|a| a.null_count() == 0)
        .ok_or_else(|| ArchiveError::decode(key, "event_time is not Timestamp(ns)"))?;
    let mut h = Sha256::new();
    for i in 0..b.num_rows() {
        hash_row(&mut h, pk.value(i), t.value(i), sk.value(i), v.value(i));
    }
    Ok(h.finalize().into())
}

/// Decodes every slice of every partition of the stored payload through the reader queries
/// use (nothing cached) and compares its rows' digest with the one recorded from the rows
/// handed in. Checking the whole file as one buffer would pass a payload whose ranged
/// reads cannot be decoded (a partition spanning row groups once was one).
async fn verify_decoded(
    op: &opendal::Operator,
    m: &SegmentManifest,
    digests: &[[u8; 32]],
) -> Result<(), ArchiveError> {
    let key = m.payload_key.as_str();
    let cache = SegmentCache::with_partition_bytes(0);
    let metrics = ArchiveScanMetrics::default();
    let mut want = digests.iter();
    for p in &m.partitions {
        for g in &p.slices {
            // Each group's reads are retried on their own (a transient failure of one
            // ranged read should not restart the whole segment).
            let mut attempt = 0;
            let batch = loop {
                match slice_rows(op, &cache, m, p, g, &metrics, None).await {
                    Err(e) if retry_transient(&e, &mut attempt).await => {}
                    other => break other?,
                }
            };
            if batch.num_rows() as u64 != g.rows {
                return Err(ArchiveError::RowCountMismatch {
                    key: key.to_string(),
                    expected: g.rows,
                    actual: batch.num_rows() as u64,
                });
            }
            let expected = want.next().ok_or_else(|| {
                ArchiveError::decode(key, "more slices than the encoder recorded")
            })?;
            if batch_digest(key, &batch)? != *expected {
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

/// Creates the manifest once and reads it back. A manifest already there from an earlier
/// attempt of this generation is accepted when it describes the same segment (every field
/// but `created_at`, and but the payload key when both are unique multipart keys: the same
/// length and SHA-256 under another nonce).
async fn commit_manifest(
    op: &opendal::Operator,
    manifest: SegmentManifest,
    manifest_key: &str,
    manifest_bytes: Vec<u8>,
) -> Result<WrittenSegment, ArchiveError> {
    let same = |mine: &SegmentManifest, other: &SegmentManifest| {
        let mut mine = mine.clone();
        mine.created_at = other.created_at;
        let nonce_keys = mine.payload_key != other.payload_key
            && !mine.payload_key.ends_with("/payload.parquet")
            && !other.payload_key.ends_with("/payload.parquet");
        if nonce_keys {
            mine.payload_key = other.payload_key.clone();
        }
        mine == *other
    };
    match create_once(op, manifest_key, Bytes::from(manifest_bytes)).await {
        Ok(()) => {}
        Err(ArchiveError::AlreadyExistsDifferent { .. }) => {
            let existing = SegmentManifest::parse(&read(op, manifest_key).await?, manifest_key)?;
            if !same(&manifest, &existing) {
                return Err(ArchiveError::AlreadyExistsDifferent {
                    key: manifest_key.to_string(),
                });
            }
        }
        Err(e) => return Err(e),
    }
    let back = SegmentManifest::parse(&read(op, manifest_key).await?, manifest_key)?;
    if !same(&manifest, &back) {
        return Err(ArchiveError::InvalidManifest {
            key: manifest_key.to_string(),
            reason: "read-back manifest differs from the one written".into(),
        });
    }
    if back.payload_key != manifest.payload_key {
        // An earlier attempt's manifest won; this attempt's payload is referenced by nothing
        // (garbage collection would remove it too).
        if let Err(err) = op.delete(&manifest.payload_key).await {
            tracing::warn!(key = %manifest.payload_key, error = %err, "could not remove an unused segment payload");
        }
    }
    crate::failpoint::hit("segment_after_manifest");
    Ok(WrittenSegment {
        manifest_key: manifest_key.to_string(),
        manifest: Arc::new(back),
    })
}
