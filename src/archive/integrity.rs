//! Payload integrity: the whole-object SHA-256, the per-block SHA-256 digests that let ranged
//! reads verify exactly the bytes they decode, and the record-level checks (partition, bucket,
//! order, count) applied to everything a reader returns.
//!
//! Parquet has no page checksums in this writer, and a flipped bit inside a compressed page
//! can decode into plausible but wrong rows. Recording a digest for every [`BLOCK_SIZE`] slice
//! of the payload closes that hole at a small cost: ranged reads are widened to whole blocks
//! and every block is hashed before any byte of it is handed to a decoder.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use futures::TryStreamExt;
use sha2::{Digest, Sha256};

use super::{ArchiveError, ArchiveScanMetrics, Manifest};
use crate::model::{BucketKey, PartitionKey, Record};

/// Size of the verification blocks recorded in new manifests (1 MiB): large enough that a
/// 1 GiB payload needs 1024 digests, small enough that widening a ranged read to whole blocks
/// costs little next to a Parquet row group.
pub const BLOCK_SIZE: u64 = 1 << 20;

/// Streaming digests of a payload as its bytes go by.
#[derive(Clone)]
pub(crate) struct PayloadDigest {
    /// `None` when only block digests are wanted (the writer's read-back comparison).
    whole: Option<Sha256>,
    block: Sha256,
    block_size: u64,
    block_fill: u64,
    blocks: Vec<String>,
    len: u64,
}

/// The finished digests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Digests {
    pub sha256: String,
    pub len: u64,
    pub blocks: Vec<String>,
}

impl PayloadDigest {
    pub fn new(block_size: u64) -> Self {
        Self {
            whole: Some(Sha256::new()),
            block: Sha256::new(),
            block_size,
            block_fill: 0,
            blocks: Vec::new(),
            len: 0,
        }
    }

    /// Block digests and length only.
    pub fn blocks_only(block_size: u64) -> Self {
        Self {
            whole: None,
            ..Self::new(block_size)
        }
    }

    pub fn update(&mut self, mut data: &[u8]) {
        if let Some(w) = &mut self.whole {
            w.update(data);
        }
        self.len += data.len() as u64;
        while !data.is_empty() {
            let room = (self.block_size - self.block_fill) as usize;
            let n = room.min(data.len());
            self.block.update(&data[..n]);
            self.block_fill += n as u64;
            data = &data[n..];
            if self.block_fill == self.block_size {
                let done = std::mem::replace(&mut self.block, Sha256::new());
                self.blocks.push(hex::encode(done.finalize()));
                self.block_fill = 0;
            }
        }
    }

    pub fn finish(mut self) -> Digests {
        if self.block_fill > 0 {
            self.blocks.push(hex::encode(self.block.finalize()));
            self.block_fill = 0;
        }
        Digests {
            sha256: self
                .whole
                .map(|w| hex::encode(w.finalize()))
                .unwrap_or_default(),
            len: self.len,
            blocks: self.blocks,
        }
    }
}

pub(crate) fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Length and SHA-256 of a whole payload held in memory against its manifest.
pub(crate) fn verify_whole(key: &str, bytes: &[u8], m: &Manifest) -> Result<(), ArchiveError> {
    if bytes.len() as u64 != m.byte_length {
        return Err(length_error(key, m.byte_length, bytes.len() as u64));
    }
    let actual = sha256_hex(bytes);
    if actual != m.sha256 {
        return Err(ArchiveError::ChecksumMismatch {
            key: key.to_string(),
            expected: m.sha256.clone(),
            actual,
        });
    }
    Ok(())
}

fn length_error(key: &str, expected: u64, actual: u64) -> ArchiveError {
    if actual < expected {
        ArchiveError::Truncated {
            key: key.to_string(),
            reason: format!("{actual} of {expected} bytes present"),
        }
    } else {
        ArchiveError::LengthMismatch {
            key: key.to_string(),
            expected,
            actual,
        }
    }
}

/// Streams a stored object once and returns its length and block digests (the writer's
/// read-back check; `sha256` is left empty).
pub(crate) async fn digest_stored(
    op: &opendal::Operator,
    key: &str,
    block_size: u64,
) -> Result<Digests, ArchiveError> {
    let reader = op
        .reader_with(key)
        .chunk(block_size as usize)
        .await
        .map_err(|e| ArchiveError::storage("read", key, e))?;
    let mut stream = reader
        .into_stream(..)
        .await
        .map_err(|e| ArchiveError::storage("read", key, e))?;
    let mut d = PayloadDigest::blocks_only(block_size);
    while let Some(buf) = stream
        .try_next()
        .await
        .map_err(|e| ArchiveError::storage("read", key, e))?
    {
        for chunk in buf {
            d.update(&chunk);
        }
    }
    Ok(d.finish())
}

/// The stored length of an object must be the manifest's before any ranged read.
pub(crate) async fn check_stored_length(
    op: &opendal::Operator,
    m: &Manifest,
    metrics: &ArchiveScanMetrics,
) -> Result<(), ArchiveError> {
    let key = &m.payload_key;
    let meta = op
        .stat(key)
        .await
        .map_err(|e| ArchiveError::storage("stat", key, e))?;
    ArchiveScanMetrics::add(&metrics.requests, 1);
    if meta.content_length() != m.byte_length {
        return Err(length_error(key, m.byte_length, meta.content_length()));
    }
    Ok(())
}

/// Ranged reads of one payload in which every returned byte comes from a block whose digest
/// matched the manifest. A few recently verified blocks are kept, since Parquet readers fetch
/// the footer, then the page index, then column chunks, often from the same tail block.
pub(crate) struct VerifiedReader {
    op: opendal::Operator,
    manifest: Arc<Manifest>,
    metrics: Arc<ArchiveScanMetrics>,
    cache: Mutex<VecDeque<(u64, Bytes)>>,
    /// Set only by the writer's decode check, right after it compared every stored block
    /// with what it uploaded: hashing the same bytes again would prove nothing new.
    skip_block_hashes: bool,
}

const CACHED_BLOCKS: usize = 4;

impl VerifiedReader {
    pub fn new(
        op: opendal::Operator,
        manifest: Arc<Manifest>,
        metrics: Arc<ArchiveScanMetrics>,
    ) -> Self {
        Self {
            op,
            manifest,
            metrics,
            cache: Mutex::new(VecDeque::new()),
            skip_block_hashes: false,
        }
    }

    /// See `skip_block_hashes`.
    pub fn just_verified(mut self) -> Self {
        self.skip_block_hashes = true;
        self
    }

    pub fn key(&self) -> &str {
        &self.manifest.payload_key
    }

    pub fn len(&self) -> u64 {
        self.manifest.byte_length
    }

    fn cached(&self, block: u64) -> Option<Bytes> {
        let cache = self.cache.lock().expect("block cache lock");
        cache
            .iter()
            .find(|(b, _)| *b == block)
            .map(|(_, d)| d.clone())
    }

    fn remember(&self, block: u64, data: Bytes) {
        let mut cache = self.cache.lock().expect("block cache lock");
        if cache.iter().any(|(b, _)| *b == block) {
            return;
        }
        if cache.len() == CACHED_BLOCKS {
            cache.pop_front();
        }
        cache.push_back((block, data));
    }

    /// Verified bytes of `range` (which must lie inside the payload).
    pub async fn read(&self, range: Range<u64>) -> Result<Bytes, ArchiveError> {
        let key = self.key();
        let len = self.len();
        if range.start > range.end || range.end > len {
            return Err(ArchiveError::decode(
                key,
                format!("read of {range:?} beyond the {len}-byte payload"),
            ));
        }
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let bs = self.manifest.block_size;
        let first = range.start / bs;
        let last = (range.end - 1) / bs;
        let mut blocks: Vec<Option<Bytes>> = (first..=last).map(|b| self.cached(b)).collect();
        // Fetch each run of missing blocks in one request.
        let mut i = 0;
        while i < blocks.len() {
            if blocks[i].is_some() {
                i += 1;
                continue;
            }
            let mut j = i;
            while j + 1 < blocks.len() && blocks[j + 1].is_none() {
                j += 1;
            }
            let (b0, b1) = (first + i as u64, first + j as u64);
            let start = b0 * bs;
            let end = ((b1 + 1) * bs).min(len);
            let data = self
                .op
                .read_with(key)
                .range(start..end)
                .await
                .map_err(|e| ArchiveError::storage("read", key, e))?
                .to_bytes();
            ArchiveScanMetrics::add(&self.metrics.requests, 1);
            ArchiveScanMetrics::add(&self.metrics.bytes_read, data.len() as u64);
            if data.len() as u64 != end - start {
                return Err(ArchiveError::Truncated {
                    key: key.to_string(),
                    reason: format!("ranged read {start}..{end} returned {} bytes", data.len()),
                });
            }
            for b in b0..=b1 {
                let off = ((b - b0) * bs) as usize;
                let blen = (((b + 1) * bs).min(len) - b * bs) as usize;
                let block = data.slice(off..off + blen);
                if !self.skip_block_hashes {
                    let actual = sha256_hex(&block);
                    let expected = &self.manifest.block_sha256[b as usize];
                    if &actual != expected {
                        return Err(ArchiveError::ChecksumMismatch {
                            key: format!("{key} (block {b})"),
                            expected: expected.clone(),
                            actual,
                        });
                    }
                }
                self.remember(b, block.clone());
                blocks[(b - first) as usize] = Some(block);
            }
            i = j + 1;
        }
        let start_in_first = (range.start - first * bs) as usize;
        let want = (range.end - range.start) as usize;
        if blocks.len() == 1 {
            let b = blocks.pop().flatten().expect("block fetched");
            return Ok(b.slice(start_in_first..start_in_first + want));
        }
        let mut out = BytesMut::with_capacity(want);
        let mut skip = start_in_first;
        for b in blocks.into_iter().flatten() {
            let take = (b.len() - skip).min(want - out.len());
            out.extend_from_slice(&b[skip..skip + take]);
            skip = 0;
        }
        Ok(out.freeze())
    }
}

/// The bucket identity and clustering rules every decoded row must satisfy.
pub(crate) struct RowCheck<'a> {
    key: &'a str,
    partition: &'a PartitionKey,
    bucket: BucketKey,
    // The bucket bounds in microseconds, computed once: this runs for every decoded row.
    start_us: i64,
    end_us: i64,
    last: Option<(i64, Vec<u8>)>,
}

impl<'a> RowCheck<'a> {
    pub fn new(key: &'a str, m: &'a Manifest) -> Self {
        let (start, end) = m.bucket_key.bounds();
        Self {
            key,
            partition: &m.partition_key,
            bucket: m.bucket_key,
            start_us: start.as_micros(),
            end_us: end.as_micros(),
            last: None,
        }
    }

    /// Continues the order check after `last` (the previous row in stored order).
    pub fn resume(&mut self, last: Option<(i64, Vec<u8>)>) {
        self.last = last;
    }

    /// The last row checked.
    pub fn last(&self) -> Option<(i64, Vec<u8>)> {
        self.last.clone()
    }

    /// Checks one row in stored order (strictly increasing clustering key).
    pub fn row(&mut self, pk: &[u8], micros: i64, sort: &[u8]) -> Result<(), ArchiveError> {
        if pk != self.partition.as_bytes() {
            return Err(ArchiveError::decode(
                self.key,
                format!(
                    "row of partition {} in an archive of partition {}",
                    hex::encode(pk),
                    self.partition.to_hex()
                ),
            ));
        }
        if micros < self.start_us || micros >= self.end_us {
            return Err(ArchiveError::decode(
                self.key,
                format!("row at {micros} us outside bucket {}", self.bucket),
            ));
        }
        match &mut self.last {
            Some((lt, ls)) => {
                if (micros, sort) <= (*lt, ls.as_slice()) {
                    return Err(ArchiveError::decode(
                        self.key,
                        "rows are not in strictly increasing (event_time, sort_key) order",
                    ));
                }
                // Reuse the buffer: no allocation per row.
                *lt = micros;
                ls.clear();
                ls.extend_from_slice(sort);
            }
            None => self.last = Some((micros, sort.to_vec())),
        }
        Ok(())
    }
}

/// Record-level checks of a fully decoded payload against its manifest.
pub(crate) fn check_records(
    key: &str,
    m: &Manifest,
    records: &[Record],
) -> Result<(), ArchiveError> {
    if records.len() as u64 != m.row_count {
        return Err(ArchiveError::RowCountMismatch {
            key: key.to_string(),
            expected: m.row_count,
            actual: records.len() as u64,
        });
    }
    let mut check = RowCheck::new(key, m);
    for r in records {
        check.row(
            r.partition_key.as_bytes(),
            r.event_time.as_micros(),
            r.sort_key.as_bytes(),
        )?;
    }
    let min = records.first().map(|r| r.event_time);
    let max = records.last().map(|r| r.event_time);
    if (min, max) != (m.min_event_time, m.max_event_time) {
        return Err(ArchiveError::decode(
            key,
            "decoded event-time range differs from the manifest",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_digests_match_one_shot_hashes() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        for split in [1usize, 7, 4096, 9999] {
            let mut d = PayloadDigest::new(1000);
            for c in data.chunks(split) {
                d.update(c);
            }
            let out = d.finish();
            assert_eq!(out.len, 10_000);
            assert_eq!(out.sha256, sha256_hex(&data));
            assert_eq!(out.blocks.len(), 10);
            assert_eq!(out.blocks[3], sha256_hex(&data[3000..4000]));
        }
        let d = PayloadDigest::new(1000);
        assert!(d.finish().blocks.is_empty());
    }
}
