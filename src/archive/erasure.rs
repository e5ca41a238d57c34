//! The erasure log: what an erasure request removed, kept in the archive bucket under
//! `<prefix>/erasures/`, beside the data it is about and out of reach of a hot-store restore.
//!
//! A restore of a hot-store backup brings back the hot rows and the masks the backup held,
//! so anything recorded only in the hot store is rolled back with it. The log therefore
//! lives in object storage, written create-once (one PUT with `If-None-Match: *`, as
//! manifests are) and never rewritten, and every archiver start re-applies it. Garbage
//! collection never lists it as a candidate.
//!
//! Per erasure `ID` (`e-YYYYMMDDTHHMMSSZ-xxxxxxxx`):
//! - `erasures/ID/request.json`: the table, the operator's reference and the time;
//! - `erasures/ID/keys-N.json`: the keys (partition, event time, sort key) of the rows the
//!   attempt N of the statement changed, written before the change is applied, with a
//!   SHA-256 of each erased value (never the value itself);
//! - `erasures/ID/objects.json`: the archive objects (manifest keys) that held an erased row
//!   when the statement had been applied: what must be gone before the erasure is complete;
//! - `erasures/ID/applied.json`: the request completed (written last); an erasure without it
//!   failed, and is neither re-applied nor proven;
//! - `erasures/ID/deleted-HASH.json`: when garbage collection deleted one of those objects.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::write::is_condition_failure;
use super::{ArchiveError, ArchiveStore, RouteManifest};
use crate::model::{BucketId, EventTime, PartitionKey, SortKey, TableId};

/// The directory of the log, under the archive prefix.
pub const ERASURES_DIR: &str = "erasures/";

/// The one version of the log's records this build writes and reads.
pub const ERASURE_LOG_VERSION: u32 = 1;

/// An erasure's id: `e-` then the request's UTC time to the second, then 8 random hex
/// digits. Safe as a path component; sorts by time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ErasureId(String);

impl ErasureId {
    /// A new id for a request made at `at`.
    pub fn generate(at: DateTime<Utc>) -> Self {
        let random: u32 = rand::random();
        Self(format!("e-{}-{random:08x}", at.format("%Y%m%dT%H%M%SZ")))
    }

    /// Parses an id an operator typed or a key named.
    pub fn parse(s: &str) -> Result<Self, ArchiveError> {
        let ok = s.len() == 27
            && s.starts_with("e-")
            && DateTime::parse_from_str(&format!("{}+0000", &s[2..18]), "%Y%m%dT%H%M%SZ%z").is_ok()
            && s.as_bytes()[18] == b'-'
            && s[19..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if ok {
            Ok(Self(s.to_string()))
        } else {
            Err(ArchiveError::Config(format!(
                "{s:?} is not an erasure id (e-YYYYMMDDTHHMMSSZ-xxxxxxxx, as `pulpitum erasure list` shows)"
            )))
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ErasureId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One erased row's key: enough to find the row again, nothing of its value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ErasedKey {
    /// The row's partition.
    pub partition_key: PartitionKey,
    /// The row's event time.
    pub event_time: EventTime,
    /// The row's sort key.
    pub sort_key: SortKey,
    /// SHA-256 of the erased value: a row written later under the same key with other
    /// content is not the erased row, and the re-apply leaves it alone.
    pub value_sha256: [u8; 32],
}

impl ErasedKey {
    /// The key of `record`, erased with the value it holds.
    pub fn of(record: &crate::model::Record) -> Self {
        Self {
            partition_key: record.partition_key.clone(),
            event_time: record.event_time,
            sort_key: record.sort_key.clone(),
            value_sha256: Sha256::digest(&record.value).into(),
        }
    }

    /// Whether `record` is this erased row: the same key and the erased value.
    pub fn matches(&self, record: &crate::model::Record) -> bool {
        self.event_time == record.event_time
            && self.sort_key == record.sort_key
            && self.partition_key == record.partition_key
            && <[u8; 32]>::from(Sha256::digest(&record.value)) == self.value_sha256
    }
}

/// An erasure as the log holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErasureEntry {
    /// Its id.
    pub id: ErasureId,
    /// The table it erased from.
    pub table_id: TableId,
    /// The operator's reference (a ticket number), if given.
    pub reference: Option<String>,
    /// When it was requested.
    pub requested_at: DateTime<Utc>,
    /// Every erased row's key, over all attempts of the statement, sorted, without repeats.
    pub keys: Vec<ErasedKey>,
    /// The objects that held an erased row once the statement had been applied (`None`:
    /// not recorded yet; the archiver records it at its next start).
    pub objects: Option<Vec<String>>,
    /// When garbage collection deleted each of those objects, as far as it recorded.
    pub deleted: BTreeMap<String, DateTime<Utc>>,
    /// Whether the request completed (its `DELETE` applied and its objects recorded). An
    /// erasure whose request failed is neither re-applied nor proven: its operator saw the
    /// failure and no id.
    pub applied: bool,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestRecord {
    version: u32,
    erasure_id: String,
    table_id: String,
    reference: Option<String>,
    requested_at: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyRecord {
    partition_key: String,
    event_time_us: i64,
    sort_key: String,
    value_sha256: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysRecord {
    version: u32,
    erasure_id: String,
    keys: Vec<KeyRecord>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ObjectsRecord {
    version: u32,
    erasure_id: String,
    recorded_at: String,
    objects: Vec<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct AppliedRecord {
    version: u32,
    erasure_id: String,
    rows: u64,
    applied_at: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeletedRecord {
    version: u32,
    erasure_id: String,
    object_key: String,
    deleted_at: String,
}

fn time_text(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn invalid(key: &str, reason: impl std::fmt::Display) -> ArchiveError {
    ArchiveError::InvalidErasureRecord {
        key: key.to_string(),
        reason: reason.to_string(),
    }
}

fn parse_time(key: &str, s: &str) -> Result<DateTime<Utc>, ArchiveError> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| invalid(key, format!("bad time {s:?}: {e}")))
}

/// Parses a record, refusing an unknown version before anything else is read from it.
fn parse_record<T: for<'de> Deserialize<'de>>(key: &str, bytes: &[u8]) -> Result<T, ArchiveError> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| invalid(key, format!("not JSON: {e}")))?;
    match value.get("version").and_then(|v| v.as_u64()) {
        Some(v) if v == u64::from(ERASURE_LOG_VERSION) => {}
        Some(v) => {
            return Err(ArchiveError::UnsupportedErasureVersion {
                key: key.to_string(),
                version: v,
            })
        }
        None => return Err(invalid(key, "no version")),
    }
    serde_json::from_value(value).map_err(|e| invalid(key, e))
}

impl ArchiveStore {
    #[cfg(test)]
    fn erasure_key_root_file(&self, name: &str) -> String {
        self.rooted(&format!("{ERASURES_DIR}{name}"))
    }

    fn erasure_key(&self, id: &ErasureId, name: &str) -> String {
        self.rooted(&format!("{ERASURES_DIR}{id}/{name}"))
    }

    /// The log's directory as garbage collection sees keys (with the prefix): never a
    /// candidate for deletion.
    pub fn erasure_log_root(&self) -> String {
        self.rooted(ERASURES_DIR)
    }

    /// Writes one record create-once; the same bytes already there are success (a retry of
    /// a write whose answer was lost), different bytes are
    /// [`ArchiveError::AlreadyExistsDifferent`].
    async fn put_once(&self, key: &str, bytes: Vec<u8>) -> Result<(), ArchiveError> {
        match self
            .op
            .write_with(key, bytes.clone())
            .if_not_exists(true)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_condition_failure(&e) => {
                let existing = self
                    .op
                    .read(key)
                    .await
                    .map_err(|e| ArchiveError::storage("read", key, e))?
                    .to_vec();
                if existing == bytes {
                    Ok(())
                } else {
                    Err(ArchiveError::AlreadyExistsDifferent {
                        key: key.to_string(),
                    })
                }
            }
            Err(e) => Err(ArchiveError::storage("write", key, e)),
        }
    }

    /// Records a new erasure request (before anything is changed).
    pub async fn log_erasure_request(
        &self,
        id: &ErasureId,
        table_id: &TableId,
        reference: Option<&str>,
        requested_at: DateTime<Utc>,
    ) -> Result<(), ArchiveError> {
        let record = RequestRecord {
            version: ERASURE_LOG_VERSION,
            erasure_id: id.to_string(),
            table_id: table_id.to_string(),
            reference: reference.map(str::to_string),
            requested_at: time_text(requested_at),
        };
        let bytes = serde_json::to_vec_pretty(&record).expect("serialisable");
        self.put_once(&self.erasure_key(id, "request.json"), bytes)
            .await
    }

    /// Records the keys attempt `attempt` of the erasure's statement is about to change.
    pub async fn log_erased_keys(
        &self,
        id: &ErasureId,
        attempt: u32,
        keys: &[ErasedKey],
    ) -> Result<(), ArchiveError> {
        let record = KeysRecord {
            version: ERASURE_LOG_VERSION,
            erasure_id: id.to_string(),
            keys: keys
                .iter()
                .map(|k| KeyRecord {
                    partition_key: k.partition_key.to_hex(),
                    event_time_us: k.event_time.as_micros(),
                    sort_key: hex::encode(k.sort_key.as_bytes()),
                    value_sha256: hex::encode(k.value_sha256),
                })
                .collect(),
        };
        let bytes = serde_json::to_vec(&record).expect("serialisable");
        self.put_once(
            &self.erasure_key(id, &format!("keys-{attempt}.json")),
            bytes,
        )
        .await
    }

    /// Records the objects that held an erased row once the statement was applied.
    pub async fn log_erased_objects(
        &self,
        id: &ErasureId,
        objects: &[String],
        at: DateTime<Utc>,
    ) -> Result<(), ArchiveError> {
        let record = ObjectsRecord {
            version: ERASURE_LOG_VERSION,
            erasure_id: id.to_string(),
            recorded_at: time_text(at),
            objects: objects.to_vec(),
        };
        let bytes = serde_json::to_vec_pretty(&record).expect("serialisable");
        self.put_once(&self.erasure_key(id, "objects.json"), bytes)
            .await
    }

    /// Records that the request completed: its `DELETE` applied (`rows` deleted) and its
    /// objects recorded. Written last.
    pub async fn log_erasure_applied(
        &self,
        id: &ErasureId,
        rows: u64,
        at: DateTime<Utc>,
    ) -> Result<(), ArchiveError> {
        let record = AppliedRecord {
            version: ERASURE_LOG_VERSION,
            erasure_id: id.to_string(),
            rows,
            applied_at: time_text(at),
        };
        let bytes = serde_json::to_vec_pretty(&record).expect("serialisable");
        self.put_once(&self.erasure_key(id, "applied.json"), bytes)
            .await
    }

    /// Records that garbage collection deleted `object_key`, one of the erasure's objects.
    pub async fn log_erased_object_deleted(
        &self,
        id: &ErasureId,
        object_key: &str,
        at: DateTime<Utc>,
    ) -> Result<(), ArchiveError> {
        let record = DeletedRecord {
            version: ERASURE_LOG_VERSION,
            erasure_id: id.to_string(),
            object_key: object_key.to_string(),
            deleted_at: time_text(at),
        };
        let digest = hex::encode(&Sha256::digest(object_key.as_bytes())[..8]);
        let bytes = serde_json::to_vec_pretty(&record).expect("serialisable");
        match self
            .put_once(
                &self.erasure_key(id, &format!("deleted-{digest}.json")),
                bytes,
            )
            .await
        {
            // A second deletion of the same object (two collectors) keeps the first time.
            Err(ArchiveError::AlreadyExistsDifferent { .. }) => Ok(()),
            other => other,
        }
    }

    /// Every object now in the archive that holds `bucket`, as manifest keys with their
    /// manifests: the bucket's own archives (every generation under its directory) and the
    /// segments of its compaction window that hold it. Routed, retired or orphaned alike:
    /// this is what is stored, not what the registry names. A manifest that cannot be read
    /// is an error (an erasure never reports "gone" over an object it could not look into).
    pub async fn objects_of_bucket(
        &self,
        bucket: &BucketId,
    ) -> Result<Vec<(String, RouteManifest)>, ArchiveError> {
        let (own, segments) = self.bucket_dirs(bucket);
        let mut out = Vec::new();
        for key in self.manifests_under(&own).await? {
            let m = self.open_route(&key, bucket).await?;
            out.push((key, m));
        }
        for key in self.manifests_under(&segments).await? {
            let m = self.read_segment_manifest(&key).await?;
            if m.entry_for(&key, bucket).is_ok() {
                out.push((key, RouteManifest::Segment(m)));
            }
        }
        Ok(out)
    }

    /// Directories (with a trailing `/`) where `bucket`'s objects are written that hold files
    /// but no `manifest.json`: uploads a crash or an abandoned compaction left, whose bytes
    /// may hold the bucket's rows and cannot be read as an archive. (An unfinished multipart
    /// upload is not listed by the object store at all.)
    pub async fn unmanifested_dirs_of_bucket(
        &self,
        bucket: &BucketId,
    ) -> Result<Vec<String>, ArchiveError> {
        let (own, segments) = self.bucket_dirs(bucket);
        let mut out = Vec::new();
        for dir in [own, segments] {
            let entries: Vec<opendal::Entry> = self
                .op
                .lister_with(&dir)
                .recursive(true)
                .await
                .map_err(|e| ArchiveError::storage("list", &dir, e))?
                .try_collect()
                .await
                .map_err(|e| ArchiveError::storage("list", &dir, e))?;
            let mut dirs: BTreeMap<String, bool> = BTreeMap::new();
            for e in entries.iter().filter(|e| e.metadata().is_file()) {
                if let Some((d, name)) = e.path().rsplit_once('/') {
                    *dirs.entry(format!("{d}/")).or_default() |= name == "manifest.json";
                }
            }
            out.extend(dirs.into_iter().filter(|(_, m)| !m).map(|(d, _)| d));
        }
        Ok(out)
    }

    /// The two directories a bucket's objects are written under: its own (every generation)
    /// and its compaction window's segments.
    fn bucket_dirs(&self, bucket: &BucketId) -> (String, String) {
        let own = format!(
            "{}/",
            self.rooted(&format!(
                "v4/{}/{}/{}",
                bucket.table_id,
                bucket.partition_key.to_hex(),
                bucket.bucket_key
            ))
        );
        let segments = self.rooted(&format!(
            "v4/{}/segments/{}/",
            bucket.table_id,
            bucket.bucket_key.window()
        ));
        (own, segments)
    }

    /// Manifest keys under a directory, sorted.
    async fn manifests_under(&self, dir: &str) -> Result<Vec<String>, ArchiveError> {
        let entries: Vec<opendal::Entry> = self
            .op
            .lister_with(dir)
            .recursive(true)
            .await
            .map_err(|e| ArchiveError::storage("list", dir, e))?
            .try_collect()
            .await
            .map_err(|e| ArchiveError::storage("list", dir, e))?;
        let mut keys: Vec<String> = entries
            .into_iter()
            .map(|e| e.path().to_string())
            .filter(|k| k.ends_with("/manifest.json"))
            .collect();
        keys.sort();
        Ok(keys)
    }

    /// Whether anything is stored under the directory of the object `manifest_key` names
    /// (its manifest, payload or upload parts): an erased object is gone only when nothing
    /// of it is left.
    pub async fn object_dir_is_empty(&self, manifest_key: &str) -> Result<bool, ArchiveError> {
        let dir = match manifest_key.rsplit_once('/') {
            Some((dir, _)) => format!("{dir}/"),
            None => return Err(invalid(manifest_key, "not a manifest key")),
        };
        let mut lister = self
            .op
            .lister_with(&dir)
            .recursive(true)
            .await
            .map_err(|e| ArchiveError::storage("list", &dir, e))?;
        while let Some(e) = lister
            .try_next()
            .await
            .map_err(|e| ArchiveError::storage("list", &dir, e))?
        {
            if e.metadata().is_file() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Every erasure in the log, oldest first.
    pub async fn erasure_ids(&self) -> Result<Vec<ErasureId>, ArchiveError> {
        let root = self.erasure_log_root();
        let entries: Vec<opendal::Entry> = self
            .op
            .lister_with(&root)
            .await
            .map_err(|e| ArchiveError::storage("list", &root, e))?
            .try_collect()
            .await
            .map_err(|e| ArchiveError::storage("list", &root, e))?;
        let mut ids = Vec::new();
        for e in entries {
            let name = e.path().trim_start_matches(&root).trim_end_matches('/');
            if name.is_empty() {
                continue;
            }
            // The log is directories, one per erasure; a file beside them (a README someone
            // copied there) is not part of it, and must not stop GC and every archiver
            // start. Said, and left alone.
            if e.metadata().is_file() {
                tracing::warn!(key = %e.path(), "a file in the erasure log's folder that is not part of the log; ignored");
                continue;
            }
            ids.push(ErasureId::parse(name).map_err(|_| {
                invalid(
                    e.path(),
                    "a name in the erasure log that is not an erasure id",
                )
            })?);
        }
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    /// One erasure, read whole from the log. [`ArchiveError::NotFound`] when it has no
    /// request record.
    pub async fn read_erasure(&self, id: &ErasureId) -> Result<ErasureEntry, ArchiveError> {
        self.read_erasure_with(id, true).await
    }

    /// One erasure without its keys (`keys` left empty): what garbage collection needs on
    /// every pass, without reading up to tens of thousands of keys per erasure.
    pub async fn read_erasure_objects(&self, id: &ErasureId) -> Result<ErasureEntry, ArchiveError> {
        self.read_erasure_with(id, false).await
    }

    async fn read_erasure_with(
        &self,
        id: &ErasureId,
        with_keys: bool,
    ) -> Result<ErasureEntry, ArchiveError> {
        let dir = self.erasure_key(id, "");
        let entries: Vec<opendal::Entry> = self
            .op
            .lister_with(&dir)
            .await
            .map_err(|e| ArchiveError::storage("list", &dir, e))?
            .try_collect()
            .await
            .map_err(|e| ArchiveError::storage("list", &dir, e))?;
        let mut names: Vec<String> = entries
            .iter()
            .map(|e| e.path().trim_start_matches(&dir).to_string())
            .filter(|n| !n.is_empty())
            .collect();
        names.sort();
        if !names.iter().any(|n| n == "request.json") {
            return Err(ArchiveError::NotFound {
                key: self.erasure_key(id, "request.json"),
            });
        }
        let read = |name: String| {
            let key = format!("{dir}{name}");
            async move {
                let bytes = self
                    .op
                    .read(&key)
                    .await
                    .map_err(|e| ArchiveError::storage("read", &key, e))?
                    .to_vec();
                Ok::<_, ArchiveError>((key, bytes))
            }
        };
        let (key, bytes) = read("request.json".into()).await?;
        let request: RequestRecord = parse_record(&key, &bytes)?;
        if request.erasure_id != id.as_str() {
            return Err(invalid(
                &key,
                format!("names erasure {}", request.erasure_id),
            ));
        }
        let table_id = TableId::new(&request.table_id).map_err(|e| invalid(&key, e))?;
        let requested_at = parse_time(&key, &request.requested_at)?;
        let mut keys = Vec::new();
        let mut objects = None;
        let mut deleted = BTreeMap::new();
        let mut applied = false;
        for name in names {
            if name.starts_with("keys-") && name.ends_with(".json") {
                if !with_keys {
                    continue;
                }
                let (key, bytes) = read(name).await?;
                let record: KeysRecord = parse_record(&key, &bytes)?;
                for k in record.keys {
                    keys.push(ErasedKey {
                        partition_key: PartitionKey::from_hex(&k.partition_key)
                            .map_err(|e| invalid(&key, e))?,
                        event_time: EventTime::from_micros(k.event_time_us)
                            .map_err(|e| invalid(&key, e))?,
                        sort_key: SortKey::new(
                            hex::decode(&k.sort_key).map_err(|e| invalid(&key, e))?,
                        )
                        .map_err(|e| invalid(&key, e))?,
                        value_sha256: hex::decode(&k.value_sha256)
                            .ok()
                            .and_then(|d| <[u8; 32]>::try_from(d).ok())
                            .ok_or_else(|| invalid(&key, "value_sha256 is not 64 hex digits"))?,
                    });
                }
            } else if name == "objects.json" {
                let (key, bytes) = read(name).await?;
                let record: ObjectsRecord = parse_record(&key, &bytes)?;
                parse_time(&key, &record.recorded_at)?;
                objects = Some(record.objects);
            } else if name == "applied.json" {
                let (key, bytes) = read(name).await?;
                let record: AppliedRecord = parse_record(&key, &bytes)?;
                parse_time(&key, &record.applied_at)?;
                applied = true;
            } else if name.starts_with("deleted-") && name.ends_with(".json") {
                let (key, bytes) = read(name).await?;
                let record: DeletedRecord = parse_record(&key, &bytes)?;
                deleted.insert(record.object_key, parse_time(&key, &record.deleted_at)?);
            } else if name != "request.json" {
                return Err(invalid(
                    &format!("{dir}{name}"),
                    "an object in the erasure log this build does not know",
                ));
            }
        }
        keys.sort();
        keys.dedup();
        Ok(ErasureEntry {
            id: id.clone(),
            table_id,
            reference: request.reference,
            requested_at,
            keys,
            objects,
            deleted,
            applied,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> ArchiveStore {
        ArchiveStore::from_url("memory://archive").unwrap()
    }

    #[test]
    fn ids_round_trip_and_refuse_anything_else() {
        let id = ErasureId::generate(Utc::now());
        assert_eq!(ErasureId::parse(id.as_str()).unwrap(), id);
        for bad in [
            "",
            "e-20261205T234500Z",
            "e-20261305T234500Z-0123abcd",
            "e-20261205T234500Z-0123ABCD",
            "../x",
            "e-20261205T234500Z-0123abcd/..",
        ] {
            assert!(ErasureId::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[tokio::test]
    async fn the_log_reads_back_what_was_written_and_refuses_unknown_versions() {
        let a = store();
        let id = ErasureId::generate(Utc::now());
        let table = TableId::new("chat").unwrap();
        let at = Utc::now();
        a.log_erasure_request(&id, &table, Some("T-113"), at)
            .await
            .unwrap();
        let k = |p: &str, t: i64, s: &[u8]| ErasedKey {
            partition_key: PartitionKey::from_hex(p).unwrap(),
            event_time: EventTime::from_micros(t).unwrap(),
            sort_key: SortKey::new(s.to_vec()).unwrap(),
            value_sha256: Sha256::digest(s).into(),
        };
        a.log_erased_keys(&id, 1, &[k("01", 5, b"a"), k("01", 4, b"b")])
            .await
            .unwrap();
        a.log_erased_keys(&id, 2, &[k("01", 5, b"a"), k("02", 1, b"c")])
            .await
            .unwrap();
        // A retried write of the same record is success; other bytes are refused.
        a.log_erased_keys(&id, 2, &[k("01", 5, b"a"), k("02", 1, b"c")])
            .await
            .unwrap();
        assert!(matches!(
            a.log_erased_keys(&id, 2, &[k("09", 1, b"z")]).await,
            Err(ArchiveError::AlreadyExistsDifferent { .. })
        ));
        a.log_erased_objects(&id, &["archive/v4/chat/x/manifest.json".into()], at)
            .await
            .unwrap();
        a.log_erased_object_deleted(&id, "archive/v4/chat/x/manifest.json", at)
            .await
            .unwrap();
        let e = a.read_erasure(&id).await.unwrap();
        assert_eq!(e.table_id, table);
        assert_eq!(e.reference.as_deref(), Some("T-113"));
        assert_eq!(
            e.keys,
            vec![k("01", 4, b"b"), k("01", 5, b"a"), k("02", 1, b"c")]
        );
        assert_eq!(e.objects.as_deref().unwrap().len(), 1);
        assert_eq!(e.deleted.len(), 1);
        assert!(!e.applied, "no applied record yet");
        a.log_erasure_applied(&id, 3, at).await.unwrap();
        let e = a.read_erasure(&id).await.unwrap();
        assert!(e.applied);
        // A stray file beside the log's folders is ignored, not an error.
        a.op.write(&a.erasure_key_root_file("README.txt"), b"notes".to_vec())
            .await
            .unwrap();
        assert_eq!(a.erasure_ids().await.unwrap(), vec![id.clone()]);
        // What GC reads every pass: the objects and deletions, not the keys.
        let light = a.read_erasure_objects(&id).await.unwrap();
        assert!(light.keys.is_empty());
        assert_eq!(light.objects, e.objects);
        assert_eq!(light.deleted, e.deleted);

        // A record of a newer version is refused by name, not misread.
        let key = a.erasure_key(&id, "keys-3.json");
        a.op.write(
            &key,
            br#"{"version": 2, "erasure_id": "x", "keys": []}"#.to_vec(),
        )
        .await
        .unwrap();
        assert!(matches!(
            a.read_erasure(&id).await,
            Err(ArchiveError::UnsupportedErasureVersion { version: 2, .. })
        ));
        let missing = ErasureId::generate(Utc::now());
        assert!(matches!(
            a.read_erasure(&missing).await,
            Err(ArchiveError::NotFound { .. })
        ));
    }
}
