//! Manifest v5: the document that names one verified segment and says where every partition
//! and bucket is inside it.
//!
//! It is strict for the same reasons as v4 (see `manifest.rs` one level up): the version
//! and kind are checked first, unknown fields are refused, and every value is checked for
//! consistency (row groups inside the payload, partitions sorted and contiguous, bucket row
//! counts summing to their partition's, every bucket inside the window), so a reader can
//! trust the row ranges it computes from it before fetching a byte of the payload.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use crate::archive::{ArchiveError, COLUMNAR_SCHEMA_VERSION};
use crate::model::{
    BucketId, BucketKey, BucketStrategy, EventTime, PartitionKey, SortKey, TableId,
    RECORD_SCHEMA_VERSION,
};

/// The manifest version of segments written now (v6: v5 plus each partition's first and
/// last `(event_time, sort_key)` in every row group it spans, for pruned reads).
pub const SEGMENT_MANIFEST_VERSION: u32 = 6;
/// Segment manifest versions still read: v5 segments (written before v6) are read whole per
/// partition, without pruning. Any other version is refused with
/// [`ArchiveError::UnsupportedManifestVersion`].
pub const SEGMENT_MANIFEST_VERSIONS: [u32; 2] = [5, 6];
/// The `kind` every v5 manifest carries.
pub const SEGMENT_KIND: &str = "segment";

/// A byte range of the payload with the SHA-256 of its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ByteRange {
    /// First byte.
    pub offset: u64,
    /// Length in bytes.
    pub length: u64,
    /// SHA-256 of the bytes, lowercase hex.
    pub sha256: String,
}

impl ByteRange {
    /// The end (exclusive).
    pub fn end(&self) -> u64 {
        self.offset + self.length
    }
}

/// One Parquet row group: its column chunks' bytes and rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RowGroupEntry {
    /// Where its column chunks lie, with their digest.
    #[serde(flatten)]
    pub range: ByteRange,
    /// Rows in the group.
    pub rows: u64,
}

/// One bucket of a partition inside a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketEntry {
    /// The bucket key (`day:2024-03-10`).
    pub key: String,
    /// Its rows (all adjacent, since rows are in time order within the partition).
    pub rows: u64,
}

/// A partition's rows inside one row group: where they are and (v6) the first and last
/// `(event_time, sort_key)` among them, so a bounded read skips groups outside its bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSlice {
    /// The row group.
    pub row_group: usize,
    /// Rows of the group before the partition's first row in it.
    pub skip: u64,
    /// The partition's rows in the group.
    pub rows: u64,
    /// First and last clustering key of those rows (None in a v5 manifest).
    pub bounds: Option<((EventTime, SortKey), (EventTime, SortKey))>,
}

/// One partition inside a segment: a contiguous run of rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionEntry {
    /// The partition.
    pub partition_key: PartitionKey,
    /// Index, in the whole payload, of its first row.
    pub first_row: u64,
    /// Its rows.
    pub rows: u64,
    /// Its buckets in time order, with their row counts.
    pub buckets: Vec<(BucketKey, u64)>,
    /// Its rows in each row group it spans, in file order (derived from the row counts;
    /// with bounds from a v6 manifest).
    pub slices: Vec<GroupSlice>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PartitionWire {
    key: String,
    first_row: u64,
    rows: u64,
    buckets: Vec<BucketEntry>,
    /// v6 only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    groups: Vec<SliceWire>,
}

/// A [`GroupSlice`] on the wire: times in microseconds since the epoch, sort keys in hex.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SliceWire {
    group: usize,
    rows: u64,
    first_time: i64,
    first_sort: String,
    last_time: i64,
    last_sort: String,
}

/// A validated segment manifest. The format is documented in `docs/archive-format.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentManifest {
    /// Its version (one of [`SEGMENT_MANIFEST_VERSIONS`]; the writer writes the newest).
    pub version: u32,
    /// The table.
    pub table_id: TableId,
    /// The table's bucket strategy.
    pub bucket_strategy: BucketStrategy,
    /// The window (a bucket of `bucket_strategy.window_strategy()`).
    pub window: BucketKey,
    /// The compaction generation (part of the keys).
    pub generation: i64,
    /// The segment's place among the window's segments of this generation.
    pub ordinal: u32,
    /// The table schema version of a columnar payload (a declared table's; record schema
    /// 3); `None` for the binary envelope (record schema 2).
    pub table_schema_version: Option<u32>,
    /// Full key of the payload.
    pub payload_key: String,
    /// Rows in the payload.
    pub row_count: u64,
    /// Payload length.
    pub byte_length: u64,
    /// SHA-256 of the whole payload.
    pub sha256: String,
    /// The tail of the payload after the last row group: page indexes, footer, magic.
    pub footer: ByteRange,
    /// Row groups in file order.
    pub row_groups: Vec<RowGroupEntry>,
    /// Partitions in key order.
    pub partitions: Vec<PartitionEntry>,
    /// When the compactor wrote it (informational).
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SegmentWire {
    manifest_version: u32,
    kind: String,
    schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    table_schema_version: Option<u32>,
    table_id: String,
    bucket_strategy: String,
    window: String,
    window_start: String,
    window_end: String,
    generation: i64,
    ordinal: u32,
    format: String,
    payload_key: String,
    row_count: u64,
    byte_length: u64,
    sha256: String,
    sort_key: Vec<String>,
    footer: ByteRange,
    row_groups: Vec<RowGroupEntry>,
    partitions: Vec<PartitionWire>,
    created_at: String,
}

/// The sort order of every segment.
const SORT_KEY: [&str; 3] = ["partition_key", "event_time", "sort_key"];

fn rfc3339(t: EventTime) -> String {
    t.to_datetime().to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The directory of a segment, relative to the store prefix.
pub(crate) fn segment_dir(table: &TableId, window: &BucketKey, ordinal: u32, gen: i64) -> String {
    format!("v4/{table}/segments/{window}/s{ordinal:05}-g{gen}")
}

impl SegmentManifest {
    /// The stored form: compact JSON (a segment of many partitions lists them all) with a
    /// trailing newline.
    pub fn to_json_bytes(&self) -> Vec<u8> {
        let (window_start, window_end) = self.window.bounds();
        let wire = SegmentWire {
            manifest_version: self.version,
            kind: SEGMENT_KIND.into(),
            schema_version: match self.table_schema_version {
                Some(_) => COLUMNAR_SCHEMA_VERSION,
                None => RECORD_SCHEMA_VERSION,
            },
            table_schema_version: self.table_schema_version,
            table_id: self.table_id.to_string(),
            bucket_strategy: self.bucket_strategy.as_str().into(),
            window: self.window.to_string(),
            window_start: rfc3339(window_start),
            window_end: rfc3339(window_end),
            generation: self.generation,
            ordinal: self.ordinal,
            format: "parquet".into(),
            payload_key: self.payload_key.clone(),
            row_count: self.row_count,
            byte_length: self.byte_length,
            sha256: self.sha256.clone(),
            sort_key: SORT_KEY.iter().map(|s| s.to_string()).collect(),
            footer: self.footer.clone(),
            row_groups: self.row_groups.clone(),
            partitions: self
                .partitions
                .iter()
                .map(|p| PartitionWire {
                    key: p.partition_key.to_hex(),
                    first_row: p.first_row,
                    rows: p.rows,
                    buckets: p
                        .buckets
                        .iter()
                        .map(|(k, rows)| BucketEntry {
                            key: k.to_string(),
                            rows: *rows,
                        })
                        .collect(),
                    groups: p
                        .slices
                        .iter()
                        .filter_map(|g| {
                            let ((ft, fs), (lt, ls)) = g.bounds.as_ref()?;
                            Some(SliceWire {
                                group: g.row_group,
                                rows: g.rows,
                                first_time: ft.as_micros(),
                                first_sort: hex::encode(fs.as_bytes()),
                                last_time: lt.as_micros(),
                                last_sort: hex::encode(ls.as_bytes()),
                            })
                        })
                        .collect(),
                })
                .collect(),
            created_at: self.created_at.to_rfc3339_opts(SecondsFormat::Micros, true),
        };
        let mut v = serde_json::to_vec(&wire).expect("a manifest always serializes");
        v.push(b'\n');
        v
    }

    /// Parses and validates manifest `key` (stored bytes). Checks the version and kind
    /// first, then every field, then that the key is where the manifest's own identity says
    /// it lives and that the payload is its sibling.
    pub fn parse(bytes: &[u8], key: &str) -> Result<Self, ArchiveError> {
        let invalid = |reason: String| ArchiveError::InvalidManifest {
            key: key.to_string(),
            reason,
        };
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| invalid(format!("not JSON: {e}")))?;
        let version = value
            .get("manifest_version")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| invalid("missing or non-integer `manifest_version`".into()))?;
        if !SEGMENT_MANIFEST_VERSIONS
            .iter()
            .any(|v| u64::from(*v) == version)
        {
            return Err(ArchiveError::UnsupportedManifestVersion(
                u32::try_from(version).unwrap_or(u32::MAX),
            ));
        }
        let schema = value
            .get("schema_version")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| invalid("missing or non-integer `schema_version`".into()))?;
        if schema != u64::from(RECORD_SCHEMA_VERSION)
            && schema != u64::from(COLUMNAR_SCHEMA_VERSION)
        {
            return Err(ArchiveError::UnsupportedSchemaVersion(
                u32::try_from(schema).unwrap_or(u32::MAX),
            ));
        }
        let columnar = schema == u64::from(COLUMNAR_SCHEMA_VERSION);
        if columnar != value.get("table_schema_version").is_some() {
            return Err(invalid(format!(
                "schema_version {schema} and table_schema_version disagree"
            )));
        }
        let w: SegmentWire = serde_json::from_value(value).map_err(|e| invalid(e.to_string()))?;
        let m = Self::from_wire(w).map_err(invalid)?;
        let dir = segment_dir(&m.table_id, &m.window, m.ordinal, m.generation);
        let suffix = format!("{dir}/manifest.json");
        if !(key == suffix || key.ends_with(&format!("/{suffix}"))) {
            return Err(ArchiveError::IdentityMismatch {
                key: key.to_string(),
                field: "manifest key",
                expected: suffix,
                actual: key.to_string(),
            });
        }
        // The payload is the manifest's sibling: `payload.parquet` (one create-once PUT) or
        // `payload-<32 hex digits>.parquet` (a multipart upload, made unique by its nonce).
        let dir = &key[..key.len() - "manifest.json".len()];
        let sibling = format!("{dir}payload.parquet");
        let nonce_sibling = m
            .payload_key
            .strip_prefix(dir)
            .and_then(|name| name.strip_prefix("payload-"))
            .and_then(|name| name.strip_suffix(".parquet"))
            .is_some_and(|n| {
                n.len() == 32
                    && n.bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            });
        if m.payload_key != sibling && !nonce_sibling {
            return Err(invalid(format!(
                "payload_key {:?} is not the manifest's sibling {sibling:?} (or \
                 payload-<nonce>.parquet)",
                m.payload_key
            )));
        }
        Ok(m)
    }

    fn from_wire(w: SegmentWire) -> Result<Self, String> {
        if w.kind != SEGMENT_KIND {
            return Err(format!("kind {:?} (expected \"segment\")", w.kind));
        }
        if w.format != "parquet" {
            return Err(format!("format {:?} (segments are parquet)", w.format));
        }
        if w.sort_key != SORT_KEY {
            return Err(format!("sort_key {:?}", w.sort_key));
        }
        let table_id = TableId::new(w.table_id).map_err(|e| e.to_string())?;
        let bucket_strategy: BucketStrategy = w
            .bucket_strategy
            .parse()
            .map_err(|e| format!("bucket_strategy: {e}"))?;
        let window = BucketKey::parse(bucket_strategy.window_strategy(), &w.window)
            .map_err(|e| format!("window: {e}"))?;
        let (ws, we) = window.bounds();
        if w.window_start != rfc3339(ws) || w.window_end != rfc3339(we) {
            return Err(format!(
                "window_start/window_end {}..{} are not the bounds of {window}",
                w.window_start, w.window_end
            ));
        }
        if w.generation < 0 {
            return Err(format!("negative generation {}", w.generation));
        }
        for (what, h) in std::iter::once(("sha256", &w.sha256))
            .chain(std::iter::once(("footer.sha256", &w.footer.sha256)))
            .chain(
                w.row_groups
                    .iter()
                    .map(|g| ("row_groups.sha256", &g.range.sha256)),
            )
        {
            if !is_sha256_hex(h) {
                return Err(format!("{what} is not 64 lowercase hex digits"));
            }
        }
        // Row groups in file order, not overlapping, all before the tail; the tail ends the
        // payload.
        let mut end = 4u64; // the leading magic
        let mut rows = 0u64;
        for (i, g) in w.row_groups.iter().enumerate() {
            if g.range.offset < end || g.range.length == 0 || g.rows == 0 {
                return Err(format!(
                    "row group {i} overlaps, is empty or is out of order"
                ));
            }
            end = g.range.end();
            rows += g.rows;
        }
        if w.footer.offset < end || w.footer.end() != w.byte_length || w.footer.length < 8 {
            return Err(format!(
                "footer {}+{} is not the tail of a {}-byte payload after its row groups",
                w.footer.offset, w.footer.length, w.byte_length
            ));
        }
        if rows != w.row_count || w.row_count == 0 {
            return Err(format!(
                "row groups hold {rows} rows, row_count is {} (segments are never empty)",
                w.row_count
            ));
        }
        let mut partitions = Vec::with_capacity(w.partitions.len());
        let mut next_row = 0u64;
        for p in w.partitions {
            let pk = PartitionKey::from_hex(&p.key).map_err(|e| format!("partition {e}"))?;
            if let Some(prev) = partitions.last().map(|e: &PartitionEntry| &e.partition_key) {
                if prev.as_bytes() >= pk.as_bytes() {
                    return Err(format!(
                        "partition {} is not after {}",
                        p.key,
                        prev.to_hex()
                    ));
                }
            }
            if p.first_row != next_row || p.rows == 0 {
                return Err(format!(
                    "partition {} starts at row {} with {} rows (expected start {next_row})",
                    p.key, p.first_row, p.rows
                ));
            }
            next_row += p.rows;
            let mut buckets = Vec::with_capacity(p.buckets.len());
            let mut sum = 0u64;
            for b in p.buckets {
                let k = BucketKey::parse(bucket_strategy, &b.key)
                    .map_err(|e| format!("partition {}: {e}", p.key))?;
                if k.window() != window {
                    return Err(format!("bucket {k} is outside window {window}"));
                }
                if buckets.last().is_some_and(|(prev, _)| *prev >= k) || b.rows == 0 {
                    return Err(format!(
                        "partition {}: bucket {k} out of order or empty",
                        p.key
                    ));
                }
                sum += b.rows;
                buckets.push((k, b.rows));
            }
            if sum != p.rows {
                return Err(format!(
                    "partition {}: buckets hold {sum} rows, the partition {}",
                    p.key, p.rows
                ));
            }
            let slices = slices_of(&w.row_groups, p.first_row, p.rows);
            let slices = if w.manifest_version >= 6 {
                with_bounds(&p.key, slices, p.groups, window, &buckets)?
            } else if !p.groups.is_empty() {
                return Err(format!("partition {}: groups in a v5 manifest", p.key));
            } else {
                slices
            };
            partitions.push(PartitionEntry {
                partition_key: pk,
                first_row: p.first_row,
                rows: p.rows,
                buckets,
                slices,
            });
        }
        if next_row != w.row_count {
            return Err(format!(
                "partitions hold {next_row} rows, row_count is {}",
                w.row_count
            ));
        }
        let created_at = DateTime::parse_from_rfc3339(&w.created_at)
            .map_err(|e| format!("created_at: {e}"))?
            .with_timezone(&Utc);
        Ok(Self {
            version: w.manifest_version,
            table_id,
            bucket_strategy,
            window,
            generation: w.generation,
            ordinal: w.ordinal,
            table_schema_version: w.table_schema_version,
            payload_key: w.payload_key,
            row_count: w.row_count,
            byte_length: w.byte_length,
            sha256: w.sha256,
            footer: w.footer,
            row_groups: w.row_groups,
            partitions,
            created_at,
        })
    }

    /// The entry of a partition (binary search: partitions are sorted).
    pub fn partition(&self, key: &PartitionKey) -> Option<&PartitionEntry> {
        self.partitions
            .binary_search_by(|p| p.partition_key.as_bytes().cmp(key.as_bytes()))
            .ok()
            .map(|i| &self.partitions[i])
    }

    /// Checks that this segment holds `bucket` (the route that led here names it), and
    /// returns its partition entry and the bucket's row count.
    pub fn entry_for(
        &self,
        key: &str,
        bucket: &BucketId,
    ) -> Result<(&PartitionEntry, u64), ArchiveError> {
        let mismatch = |field: &'static str, expected: String, actual: String| {
            ArchiveError::IdentityMismatch {
                key: key.to_string(),
                field,
                expected,
                actual,
            }
        };
        if self.table_id != bucket.table_id {
            return Err(mismatch(
                "table_id",
                bucket.table_id.to_string(),
                self.table_id.to_string(),
            ));
        }
        let entry = self.partition(&bucket.partition_key).ok_or_else(|| {
            mismatch(
                "partition_key",
                bucket.partition_key.to_hex(),
                "a segment without that partition".into(),
            )
        })?;
        let rows = entry
            .buckets
            .iter()
            .find(|(k, _)| *k == bucket.bucket_key)
            .map(|(_, rows)| *rows)
            .ok_or_else(|| {
                mismatch(
                    "bucket_key",
                    bucket.bucket_key.to_string(),
                    format!(
                        "a segment partition without that bucket (window {})",
                        self.window
                    ),
                )
            })?;
        Ok((entry, rows))
    }

    /// The row groups holding a partition's rows: their indices and, for the first, how
    /// many of its rows precede the partition.
    pub fn row_groups_of(&self, entry: &PartitionEntry) -> (std::ops::Range<usize>, u64) {
        match (entry.slices.first(), entry.slices.last()) {
            (Some(f), Some(l)) => (f.row_group..l.row_group + 1, f.skip),
            _ => (0..0, 0),
        }
    }

    /// Every bucket in the segment with its row count.
    pub fn buckets(&self) -> impl Iterator<Item = (BucketId, u64)> + '_ {
        self.partitions.iter().flat_map(move |p| {
            p.buckets.iter().map(move |(k, rows)| {
                (
                    BucketId {
                        table_id: self.table_id.clone(),
                        partition_key: p.partition_key.clone(),
                        bucket_key: *k,
                    },
                    *rows,
                )
            })
        })
    }
}

/// A partition's rows in each row group it spans (rows `first_row..first_row + rows` of
/// the payload), without bounds.
pub(crate) fn slices_of(groups: &[RowGroupEntry], first_row: u64, rows: u64) -> Vec<GroupSlice> {
    let (from, to) = (first_row, first_row + rows);
    let mut out = Vec::new();
    let mut start_row = 0u64;
    for (i, g) in groups.iter().enumerate() {
        let end_row = start_row + g.rows;
        if end_row > from && start_row < to {
            let lo = from.max(start_row);
            let hi = to.min(end_row);
            out.push(GroupSlice {
                row_group: i,
                skip: lo - start_row,
                rows: hi - lo,
                bounds: None,
            });
        }
        if end_row >= to {
            break;
        }
        start_row = end_row;
    }
    out
}

/// The derived slices with the bounds a v6 manifest gives: the same groups and row counts,
/// each slice's first key not after its last, strictly after the previous slice's last,
/// inside the partition's first and last buckets.
fn with_bounds(
    key: &str,
    mut slices: Vec<GroupSlice>,
    wire: Vec<SliceWire>,
    window: BucketKey,
    buckets: &[(BucketKey, u64)],
) -> Result<Vec<GroupSlice>, String> {
    if slices.len() != wire.len() {
        return Err(format!(
            "partition {key}: {} groups listed, its rows span {}",
            wire.len(),
            slices.len()
        ));
    }
    let bad = |what: String| format!("partition {key}: {what}");
    let point = |t: i64, s: &str| -> Result<(EventTime, SortKey), String> {
        let t = EventTime::from_micros(t).map_err(|e| bad(e.to_string()))?;
        if !window.contains(t) {
            return Err(bad(format!("group bound {t} is outside window {window}")));
        }
        let s = hex::decode(s).map_err(|e| bad(format!("sort key hex: {e}")))?;
        Ok((t, SortKey::new(s).map_err(|e| bad(e.to_string()))?))
    };
    let mut prev: Option<(EventTime, SortKey)> = None;
    for (g, w) in slices.iter_mut().zip(wire) {
        if g.row_group != w.group || g.rows != w.rows {
            return Err(bad(format!(
                "group {} with {} rows, its rows are {} in group {}",
                w.group, w.rows, g.rows, g.row_group
            )));
        }
        let first = point(w.first_time, &w.first_sort)?;
        let last = point(w.last_time, &w.last_sort)?;
        let ordered = |a: &(EventTime, SortKey), b: &(EventTime, SortKey)| {
            (a.0, a.1.as_bytes()) < (b.0, b.1.as_bytes())
        };
        if ordered(&last, &first) || (g.rows == 1) != (first == last) {
            return Err(bad(format!("group {}: bounds out of order", g.row_group)));
        }
        if prev.as_ref().is_some_and(|p| !ordered(p, &first)) {
            return Err(bad(format!(
                "group {} does not start after the previous group",
                g.row_group
            )));
        }
        prev = Some(last.clone());
        g.bounds = Some((first, last));
    }
    let (Some(fb), Some(lb)) = (buckets.first(), buckets.last()) else {
        return Err(bad("no buckets".into()));
    };
    let (Some(fs), Some(ls)) = (slices.first(), slices.last()) else {
        return Err(bad("no rows".into()));
    };
    let inside = |s: &GroupSlice, b: BucketKey, first: bool| {
        s.bounds
            .as_ref()
            .is_some_and(|(f, l)| b.contains(if first { f.0 } else { l.0 }))
    };
    if !inside(fs, fb.0, true) || !inside(ls, lb.0, false) {
        return Err(bad(
            "first or last group bound is outside its first or last bucket".into(),
        ));
    }
    Ok(slices)
}
