//! Manifest v4: the small JSON document that names one verified payload and the bucket it
//! holds. It is the unit the archiver publishes, so parsing is strict: the version fields are
//! checked first (so a v5 manifest reports "unsupported version 5", not "unknown field"), then
//! the document is decoded with unknown fields rejected, then every value is validated for
//! internal consistency and against the bucket the route names.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use super::{ArchiveError, PayloadFormat};
use crate::model::{BucketId, BucketKey, BucketStrategy, EventTime, PartitionKey, TableId};

/// The only manifest version this code reads and writes.
pub const MANIFEST_VERSION: u32 = 4;
pub use crate::model::RECORD_SCHEMA_VERSION;
/// The record schema of a columnar payload (a declared table's values as typed columns;
/// `parquet::ValueColumns`); its manifest also names the table schema version.
pub const COLUMNAR_SCHEMA_VERSION: u32 = 3;
/// The clustering key every v4 archive is ordered by.
pub const CLUSTERING_KEY: [&str; 2] = ["event_time", "sort_key"];

/// A validated manifest v4. Field meanings are documented in `docs/archive-format.md`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "ManifestWire", try_from = "ManifestWire")]
pub struct Manifest {
    /// Always [`MANIFEST_VERSION`].
    pub manifest_version: u32,
    /// The table of the bucket.
    pub table_id: TableId,
    /// The partition of the bucket.
    pub partition_key: PartitionKey,
    /// The time bucket.
    pub bucket_key: BucketKey,
    /// The table's bucket strategy (equal to `bucket_key.strategy()`).
    pub bucket_strategy: BucketStrategy,
    /// Inclusive start of the bucket.
    pub bucket_start: EventTime,
    /// Exclusive end of the bucket.
    pub bucket_end: EventTime,
    /// The archive generation (part of every key of this archive).
    pub generation: i64,
    /// The payload encoding.
    pub format: PayloadFormat,
    /// [`RECORD_SCHEMA_VERSION`], or [`COLUMNAR_SCHEMA_VERSION`] for a columnar payload.
    pub schema_version: u32,
    /// The table schema version a columnar payload was written with (exactly when
    /// `schema_version` is [`COLUMNAR_SCHEMA_VERSION`]).
    pub table_schema_version: Option<u32>,
    /// Full key of the payload (a sibling of the manifest).
    pub payload_key: String,
    /// Records in the payload.
    pub row_count: u64,
    /// Payload length in bytes.
    pub byte_length: u64,
    /// SHA-256 of the whole payload, lowercase hex.
    pub sha256: String,
    /// Size of the verification blocks (the last one may be shorter).
    pub block_size: u64,
    /// SHA-256 of each consecutive `block_size` slice of the payload, lowercase hex: ranged
    /// reads verify every block they decode.
    pub block_sha256: Vec<String>,
    /// Always `["event_time", "sort_key"]`.
    pub clustering_key: Vec<String>,
    /// Smallest event time in the payload (`None` exactly when it is empty).
    pub min_event_time: Option<EventTime>,
    /// Largest event time in the payload (`None` exactly when it is empty).
    pub max_event_time: Option<EventTime>,
    /// When the writer created the manifest (informational; not part of its identity).
    pub created_at: DateTime<Utc>,
}

/// The JSON shape, one to one. Unknown fields are rejected: an additive change is a new
/// manifest version, so an old reader fails loudly instead of ignoring what it cannot honour.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestWire {
    manifest_version: u32,
    table_id: String,
    partition_key: String,
    bucket_key: String,
    bucket_strategy: String,
    bucket_start: String,
    bucket_end: String,
    generation: i64,
    format: String,
    schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    table_schema_version: Option<u32>,
    payload_key: String,
    row_count: u64,
    byte_length: u64,
    sha256: String,
    block_size: u64,
    block_sha256: Vec<String>,
    clustering_key: Vec<String>,
    min_event_time: Option<String>,
    max_event_time: Option<String>,
    created_at: String,
}

impl From<Manifest> for ManifestWire {
    fn from(m: Manifest) -> Self {
        Self {
            manifest_version: m.manifest_version,
            table_id: m.table_id.to_string(),
            partition_key: m.partition_key.to_hex(),
            bucket_key: m.bucket_key.to_string(),
            bucket_strategy: m.bucket_strategy.as_str().to_string(),
            bucket_start: rfc3339(m.bucket_start),
            bucket_end: rfc3339(m.bucket_end),
            generation: m.generation,
            format: m.format.as_str().to_string(),
            schema_version: m.schema_version,
            table_schema_version: m.table_schema_version,
            payload_key: m.payload_key,
            row_count: m.row_count,
            byte_length: m.byte_length,
            sha256: m.sha256,
            block_size: m.block_size,
            block_sha256: m.block_sha256,
            clustering_key: m.clustering_key,
            min_event_time: m.min_event_time.map(rfc3339),
            max_event_time: m.max_event_time.map(rfc3339),
            created_at: m.created_at.to_rfc3339_opts(SecondsFormat::Micros, true),
        }
    }
}

fn rfc3339(t: EventTime) -> String {
    t.to_datetime().to_rfc3339_opts(SecondsFormat::Micros, true)
}

impl TryFrom<ManifestWire> for Manifest {
    type Error = String;

    fn try_from(w: ManifestWire) -> Result<Self, String> {
        if w.manifest_version != MANIFEST_VERSION {
            return Err(format!("manifest_version {}", w.manifest_version));
        }
        let columnar = w.schema_version == COLUMNAR_SCHEMA_VERSION;
        if w.schema_version != RECORD_SCHEMA_VERSION && !columnar {
            return Err(format!("schema_version {}", w.schema_version));
        }
        if columnar != w.table_schema_version.is_some() {
            return Err(format!(
                "schema_version {} with table_schema_version {:?} in format {}",
                w.schema_version, w.table_schema_version, w.format
            ));
        }
        let time =
            |name: &str, s: &str| EventTime::parse_rfc3339(s).map_err(|e| format!("{name}: {e}"));
        let table_id = TableId::new(w.table_id).map_err(|e| e.to_string())?;
        let partition_key =
            PartitionKey::from_hex(&w.partition_key).map_err(|e| format!("partition_key: {e}"))?;
        let bucket_strategy: BucketStrategy = w
            .bucket_strategy
            .parse()
            .map_err(|e| format!("bucket_strategy: {e}"))?;
        let bucket_key = BucketKey::parse(bucket_strategy, &w.bucket_key)
            .map_err(|e| format!("bucket_key: {e}"))?;
        let bucket_start = time("bucket_start", &w.bucket_start)?;
        let bucket_end = time("bucket_end", &w.bucket_end)?;
        if (bucket_start, bucket_end) != bucket_key.bounds() {
            return Err(format!(
                "bucket_start/bucket_end {}..{} are not the bounds of {}",
                w.bucket_start, w.bucket_end, bucket_key
            ));
        }
        if w.generation < 0 {
            return Err(format!("negative generation {}", w.generation));
        }
        let format: PayloadFormat = w.format.parse().map_err(|e: ArchiveError| e.to_string())?;
        let ext = format!("/payload.{}", format.extension());
        if !w.payload_key.ends_with(&ext) {
            return Err(format!(
                "payload_key {:?} does not end with {ext:?}",
                w.payload_key
            ));
        }
        if !is_sha256_hex(&w.sha256) {
            return Err("sha256 is not 64 lowercase hex digits".into());
        }
        if w.block_size == 0 {
            return Err("block_size is 0".into());
        }
        let blocks = w.byte_length.div_ceil(w.block_size);
        if w.block_sha256.len() as u64 != blocks {
            return Err(format!(
                "{} block digests for {} bytes in blocks of {}",
                w.block_sha256.len(),
                w.byte_length,
                w.block_size
            ));
        }
        if !w.block_sha256.iter().all(|h| is_sha256_hex(h)) {
            return Err("block_sha256 holds a value that is not 64 lowercase hex digits".into());
        }
        if w.clustering_key != CLUSTERING_KEY {
            return Err(format!(
                "clustering_key {:?} (expected [\"event_time\", \"sort_key\"])",
                w.clustering_key
            ));
        }
        let min_event_time = w
            .min_event_time
            .as_deref()
            .map(|s| time("min_event_time", s))
            .transpose()?;
        let max_event_time = w
            .max_event_time
            .as_deref()
            .map(|s| time("max_event_time", s))
            .transpose()?;
        match (w.row_count, min_event_time, max_event_time) {
            (0, None, None) => {}
            (0, _, _) => return Err("an empty payload has no min/max event time".into()),
            (_, Some(lo), Some(hi)) => {
                if lo > hi || !bucket_key.contains(lo) || !bucket_key.contains(hi) {
                    return Err(format!(
                        "min/max event time {lo}..{hi} not ordered or outside {bucket_key}"
                    ));
                }
            }
            _ => {
                return Err("min_event_time and max_event_time are required when rows exist".into())
            }
        }
        let created_at = DateTime::parse_from_rfc3339(&w.created_at)
            .map_err(|e| format!("created_at: {e}"))?
            .with_timezone(&Utc);
        Ok(Self {
            manifest_version: w.manifest_version,
            table_id,
            partition_key,
            bucket_key,
            bucket_strategy,
            bucket_start,
            bucket_end,
            generation: w.generation,
            format,
            schema_version: w.schema_version,
            table_schema_version: w.table_schema_version,
            payload_key: w.payload_key,
            row_count: w.row_count,
            byte_length: w.byte_length,
            sha256: w.sha256,
            block_size: w.block_size,
            block_sha256: w.block_sha256,
            clustering_key: w.clustering_key,
            min_event_time,
            max_event_time,
            created_at,
        })
    }
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Manifest {
    /// The bucket this manifest describes.
    pub fn bucket_id(&self) -> BucketId {
        BucketId {
            table_id: self.table_id.clone(),
            partition_key: self.partition_key.clone(),
            bucket_key: self.bucket_key,
        }
    }

    /// The stored form (pretty JSON with a trailing newline, fields in a fixed order).
    pub fn to_json_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(&ManifestWire::from(self.clone()))
            .expect("a manifest always serializes");
        v.push(b'\n');
        v
    }

    /// Whether two manifests describe the same archive: every field but `created_at`, which
    /// differs between the attempts of a retried write by design.
    pub fn same_archive(&self, other: &Manifest) -> bool {
        let mut a = self.clone();
        a.created_at = other.created_at;
        &a == other
    }

    /// Parses and validates the stored bytes of manifest `key` against the bucket the route
    /// names. Errors: [`ArchiveError::UnsupportedManifestVersion`],
    /// [`ArchiveError::UnsupportedSchemaVersion`], [`ArchiveError::InvalidManifest`] (not JSON,
    /// missing or unknown fields, inconsistent values, a key that is not this manifest's
    /// location) and [`ArchiveError::IdentityMismatch`].
    pub fn parse(bytes: &[u8], key: &str, expected: &BucketId) -> Result<Self, ArchiveError> {
        let m = Self::parse_unchecked(bytes, key)?;
        m.check_identity(key, expected)?;
        Ok(m)
    }

    /// Version checks, strict decoding and internal validation, without the route's identity.
    pub fn parse_unchecked(bytes: &[u8], key: &str) -> Result<Self, ArchiveError> {
        let invalid = |reason: String| ArchiveError::InvalidManifest {
            key: key.to_string(),
            reason,
        };
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| invalid(format!("not JSON: {e}")))?;
        let obj = value
            .as_object()
            .ok_or_else(|| invalid("not a JSON object".into()))?;
        let version = |name: &str| -> Result<u32, ArchiveError> {
            let v = obj
                .get(name)
                .ok_or_else(|| invalid(format!("missing field `{name}`")))?;
            v.as_u64()
                .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
                .ok_or_else(|| invalid(format!("`{name}` is not a non-negative integer: {v}")))
        };
        let mv = version("manifest_version")?;
        if mv != MANIFEST_VERSION {
            return Err(ArchiveError::UnsupportedManifestVersion(mv));
        }
        let sv = version("schema_version")?;
        if sv != RECORD_SCHEMA_VERSION && sv != COLUMNAR_SCHEMA_VERSION {
            return Err(ArchiveError::UnsupportedSchemaVersion(sv));
        }
        let wire: ManifestWire =
            serde_json::from_value(value).map_err(|e| invalid(e.to_string()))?;
        Manifest::try_from(wire).map_err(invalid)
    }

    fn check_identity(&self, key: &str, expected: &BucketId) -> Result<(), ArchiveError> {
        let mismatch = |field: &'static str, expected: String, actual: String| {
            Err(ArchiveError::IdentityMismatch {
                key: key.to_string(),
                field,
                expected,
                actual,
            })
        };
        if self.table_id != expected.table_id {
            return mismatch(
                "table_id",
                expected.table_id.to_string(),
                self.table_id.to_string(),
            );
        }
        if self.partition_key != expected.partition_key {
            return mismatch(
                "partition_key",
                expected.partition_key.to_hex(),
                self.partition_key.to_hex(),
            );
        }
        if self.bucket_key != expected.bucket_key {
            return mismatch(
                "bucket_key",
                expected.bucket_key.to_string(),
                self.bucket_key.to_string(),
            );
        }
        // The manifest must live where its own identity and generation say it lives, and
        // name the payload beside it: a copied or misfiled manifest is not trusted.
        let suffix = format!(
            "v4/{}/{}/{}/g{}/manifest.json",
            self.table_id,
            self.partition_key.to_hex(),
            self.bucket_key,
            self.generation
        );
        let dir_ok = key == suffix || key.ends_with(&format!("/{suffix}"));
        if !dir_ok {
            return mismatch("manifest key", suffix, key.to_string());
        }
        let sibling = format!(
            "{}payload.{}",
            &key[..key.len() - "manifest.json".len()],
            self.format.extension()
        );
        if self.payload_key != sibling {
            return mismatch("payload_key", sibling, self.payload_key.clone());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket() -> BucketId {
        BucketId {
            table_id: TableId::new("chat").unwrap(),
            partition_key: PartitionKey::new(vec![0xab]).unwrap(),
            bucket_key: BucketKey::parse_any("day:2024-03-10").unwrap(),
        }
    }

    fn sample() -> (Manifest, String) {
        let b = bucket();
        let key = "p/v4/chat/ab/day:2024-03-10/g7/manifest.json".to_string();
        let t = EventTime::parse_rfc3339("2024-03-10T01:02:03.000004Z").unwrap();
        let m = Manifest {
            manifest_version: 4,
            table_id: b.table_id.clone(),
            partition_key: b.partition_key.clone(),
            bucket_key: b.bucket_key,
            bucket_strategy: b.bucket_key.strategy(),
            bucket_start: b.bucket_key.start(),
            bucket_end: b.bucket_key.end(),
            generation: 7,
            format: PayloadFormat::Parquet,
            schema_version: 2,
            table_schema_version: None,
            payload_key: "p/v4/chat/ab/day:2024-03-10/g7/payload.parquet".into(),
            row_count: 3,
            byte_length: 10,
            sha256: "a".repeat(64),
            block_size: 4,
            block_sha256: vec!["b".repeat(64); 3],
            clustering_key: vec!["event_time".into(), "sort_key".into()],
            min_event_time: Some(t),
            max_event_time: Some(t),
            created_at: DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
                .unwrap()
                .with_timezone(&Utc),
        };
        (m, key)
    }

    fn edit(f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) -> Vec<u8> {
        let (m, _) = sample();
        let mut v: serde_json::Value = serde_json::from_slice(&m.to_json_bytes()).unwrap();
        f(v.as_object_mut().unwrap());
        serde_json::to_vec(&v).unwrap()
    }

    #[test]
    fn round_trips_and_checks_identity() {
        let (m, key) = sample();
        let parsed = Manifest::parse(&m.to_json_bytes(), &key, &bucket()).unwrap();
        assert_eq!(parsed, m);
        let mut other = bucket();
        other.bucket_key = BucketKey::parse_any("day:2024-03-11").unwrap();
        assert!(matches!(
            Manifest::parse(&m.to_json_bytes(), &key, &other),
            Err(ArchiveError::IdentityMismatch {
                field: "bucket_key",
                ..
            })
        ));
        // The same document filed under another generation's key is rejected.
        let moved = key.replace("/g7/", "/g8/");
        assert!(matches!(
            Manifest::parse(&m.to_json_bytes(), &moved, &bucket()),
            Err(ArchiveError::IdentityMismatch { .. })
        ));
    }

    #[test]
    fn versions_are_checked_before_fields() {
        let (_, key) = sample();
        for (v, field) in [(3, "manifest_version"), (5, "manifest_version")] {
            let b = edit(|o| {
                o.insert(field.into(), v.into());
                o.insert("added_in_v5".into(), true.into());
            });
            assert!(matches!(
                Manifest::parse(&b, &key, &bucket()),
                Err(ArchiveError::UnsupportedManifestVersion(x)) if x == v
            ));
        }
        for v in [1, 4] {
            let b = edit(|o| {
                o.insert("schema_version".into(), v.into());
            });
            assert!(matches!(
                Manifest::parse(&b, &key, &bucket()),
                Err(ArchiveError::UnsupportedSchemaVersion(x)) if x == v
            ));
        }
        // Record schema 3 (a columnar payload) needs its table schema version, and 2 has none.
        let b = edit(|o| {
            o.insert("schema_version".into(), 3.into());
        });
        assert!(matches!(
            Manifest::parse(&b, &key, &bucket()),
            Err(ArchiveError::InvalidManifest { .. })
        ));
        let b = edit(|o| {
            o.insert("table_schema_version".into(), 2.into());
        });
        assert!(matches!(
            Manifest::parse(&b, &key, &bucket()),
            Err(ArchiveError::InvalidManifest { .. })
        ));
    }

    #[test]
    fn strictness() {
        let (_, key) = sample();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            (
                "missing sha",
                edit(|o| {
                    o.remove("sha256");
                }),
            ),
            (
                "missing version",
                edit(|o| {
                    o.remove("manifest_version");
                }),
            ),
            (
                "unknown field",
                edit(|o| {
                    o.insert("extra".into(), 1.into());
                }),
            ),
            (
                "bad sha",
                edit(|o| {
                    o.insert("sha256".into(), "xyz".into());
                }),
            ),
            (
                "bad bounds",
                edit(|o| {
                    o.insert("bucket_end".into(), "2024-03-12T00:00:00Z".into());
                }),
            ),
            (
                "bad clustering",
                edit(|o| {
                    o.insert("clustering_key".into(), serde_json::json!(["sort_key"]));
                }),
            ),
            (
                "blocks",
                edit(|o| {
                    o.insert("byte_length".into(), 100.into());
                }),
            ),
            (
                "empty with times",
                edit(|o| {
                    o.insert("row_count".into(), 0.into());
                }),
            ),
            ("not json", b"{\"manifest_version\": 4,".to_vec()),
            ("array", b"[]".to_vec()),
        ];
        for (name, b) in cases {
            assert!(
                matches!(
                    Manifest::parse(&b, &key, &bucket()),
                    Err(ArchiveError::InvalidManifest { .. })
                ),
                "{name}"
            );
        }
    }

    #[test]
    fn same_archive_ignores_only_created_at() {
        let (m, _) = sample();
        let mut later = m.clone();
        later.created_at = Utc::now();
        assert!(m.same_archive(&later));
        later.row_count = 4;
        assert!(!m.same_archive(&later));
    }
}
