//! The JSON payload: JSON Lines with a header line, bytes as lowercase hex, streamed in both
//! directions; and the legacy raw JSON array, which stays readable.
//!
//! ```text
//! {"pulpitum_archive":"jsonl","schema_version":2,"bytes":"hex"}
//! {"partition_key":"ab01","event_time":"2024-03-10T01:02:03.000004Z","sort_key":"","value":"68690a"}
//! ```
//!
//! Every line is one record, in clustering order, each line ends with `\n`. Times are RFC 3339
//! UTC with exactly six fractional digits. Reads are whole-object reads verified block by
//! block against the manifest before a line of the block is decoded, so no row ever comes
//! from unverified bytes; a cut-off object is caught by its stored length before the first
//! row, and the whole-object SHA-256 and the row count are checked when the object ends. The
//! legacy shape (a JSON array of records, see `docs/archive-format.md`) is parsed whole and is
//! meant for the small payloads the 0.1 writer produced. A declared table's payload (record
//! schema v3) names its value columns in each line instead of the value's hex: see
//! [`columns`].

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use chrono::SecondsFormat;
use datafusion::arrow::record_batch::RecordBatch;
use futures::stream::BoxStream;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::integrity::{check_stored_length, RowCheck, VerifiedReader};
use super::parquet::{records_to_batch, ValueColumns};
use super::{
    ArchiveError, ArchiveScan, ArchiveScanMetrics, Manifest, COLUMNAR_SCHEMA_VERSION,
    RECORD_SCHEMA_VERSION,
};
use crate::model::{EventTime, PartitionKey, Record, SortKey};

mod columns;

use columns::{HeaderColumn, JsonColumns};

const MAGIC: &str = "jsonl";

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    pulpitum_archive: String,
    schema_version: u32,
    bytes: String,
    /// The table schema version a declared table's payload was written with (record
    /// schema v3 only), and its value columns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    table_schema_version: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    columns: Option<Vec<HeaderColumn>>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line<'a> {
    #[serde(borrow)]
    partition_key: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    event_time: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    sort_key: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    value: std::borrow::Cow<'a, str>,
}

/// The header line (with its newline): record schema v2, or v3 with `layout`'s columns.
pub(crate) fn header_line(layout: Option<&ValueColumns>) -> Vec<u8> {
    let mut v = serde_json::to_vec(&Header {
        pulpitum_archive: MAGIC.into(),
        schema_version: match layout {
            Some(_) => COLUMNAR_SCHEMA_VERSION,
            None => RECORD_SCHEMA_VERSION,
        },
        bytes: "hex".into(),
        table_schema_version: layout.map(ValueColumns::table_schema_version),
        columns: layout.map(JsonColumns::header),
    })
    .expect("header serializes");
    v.push(b'\n');
    v
}

/// Appends the lines of `records` to `out`, in `layout` when there is one.
pub(crate) fn encode_lines(
    key: &str,
    layout: Option<&ValueColumns>,
    records: &[Record],
    out: &mut Vec<u8>,
) -> Result<(), ArchiveError> {
    match layout {
        Some(layout) => columns::encode_lines(key, layout, records, out),
        None => {
            encode_envelope_lines(records, out);
            Ok(())
        }
    }
}

/// Appends the record schema v2 lines of `records` to `out`.
fn encode_envelope_lines(records: &[Record], out: &mut Vec<u8>) {
    for r in records {
        let line = Line {
            partition_key: r.partition_key.to_hex().into(),
            event_time: r
                .event_time
                .to_datetime()
                .to_rfc3339_opts(SecondsFormat::Micros, true)
                .into(),
            sort_key: hex::encode(r.sort_key.as_bytes()).into(),
            value: hex::encode(&r.value).into(),
        };
        serde_json::to_writer(&mut *out, &line).expect("a record line serializes");
        out.push(b'\n');
    }
}

fn decode_line(key: &str, line: &[u8], n: u64) -> Result<Record, ArchiveError> {
    let bad = |what: String| ArchiveError::decode(key, format!("record line {n}: {what}"));
    let l: Line<'_> = serde_json::from_slice(line).map_err(|e| bad(e.to_string()))?;
    let bytes = |name: &str, s: &str| hex::decode(s).map_err(|e| bad(format!("{name}: {e}")));
    Ok(Record {
        partition_key: PartitionKey::new(bytes("partition_key", &l.partition_key)?)
            .map_err(|e| bad(e.to_string()))?,
        event_time: EventTime::parse_rfc3339(&l.event_time).map_err(|e| bad(e.to_string()))?,
        sort_key: SortKey::new(bytes("sort_key", &l.sort_key)?).map_err(|e| bad(e.to_string()))?,
        value: bytes("value", &l.value)?,
    })
}

/// The header's layout: `None` for record schema v2 (each value hex), the value columns
/// for v3.
fn check_header(key: &str, line: &[u8]) -> Result<Option<JsonColumns>, ArchiveError> {
    let h: Header = serde_json::from_slice(line)
        .map_err(|e| ArchiveError::decode(key, format!("header line: {e}")))?;
    if h.pulpitum_archive != MAGIC || h.bytes != "hex" {
        return Err(ArchiveError::decode(
            key,
            format!(
                "header names {:?}/{:?}, not jsonl/hex",
                h.pulpitum_archive, h.bytes
            ),
        ));
    }
    match (h.schema_version, h.table_schema_version, &h.columns) {
        (RECORD_SCHEMA_VERSION, None, None) => Ok(None),
        (COLUMNAR_SCHEMA_VERSION, Some(_), Some(cols)) => {
            Ok(Some(JsonColumns::from_header(key, cols)?))
        }
        (RECORD_SCHEMA_VERSION | COLUMNAR_SCHEMA_VERSION, _, _) => Err(ArchiveError::decode(
            key,
            format!(
                "header: schema_version {} with table_schema_version {:?} and {} columns",
                h.schema_version,
                h.table_schema_version,
                h.columns.as_ref().map_or(0, Vec::len)
            ),
        )),
        (v, _, _) => Err(ArchiveError::UnsupportedSchemaVersion(v)),
    }
}

/// The header's layout agrees with the record schema version the manifest names.
fn check_layout(
    key: &str,
    layout: &Option<JsonColumns>,
    schema_version: u32,
) -> Result<(), ArchiveError> {
    if layout.is_some() != (schema_version == COLUMNAR_SCHEMA_VERSION) {
        return Err(ArchiveError::decode(
            key,
            format!(
                "the header's layout is not the record schema {schema_version} its manifest names"
            ),
        ));
    }
    Ok(())
}

/// A legacy byte field: a hex string or an array of byte values (serde's default `Vec<u8>`).
fn legacy_bytes(
    key: &str,
    v: &serde_json::Value,
    name: &str,
    n: usize,
) -> Result<Vec<u8>, ArchiveError> {
    let bad = || ArchiveError::decode(key, format!("legacy record {n}: bad `{name}`"));
    match v {
        serde_json::Value::String(s) => hex::decode(s).map_err(|_| bad()),
        serde_json::Value::Array(items) => items
            .iter()
            .map(|i| {
                i.as_u64()
                    .and_then(|b| u8::try_from(b).ok())
                    .ok_or_else(bad)
            })
            .collect(),
        _ => Err(bad()),
    }
}

/// Parses the legacy raw JSON array: `[{"partition_key", "event_time", "sort_key", "value"}]`
/// with bytes as hex strings or byte arrays and times as RFC 3339 strings or integer
/// microseconds since the epoch. Other fields are rejected.
pub(crate) fn decode_legacy(key: &str, bytes: &[u8]) -> Result<Vec<Record>, ArchiveError> {
    let v: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| ArchiveError::decode(key, format!("legacy JSON: {e}")))?;
    let items = v
        .as_array()
        .ok_or_else(|| ArchiveError::decode(key, "legacy JSON payload is not an array"))?;
    let mut out = Vec::with_capacity(items.len());
    for (n, item) in items.iter().enumerate() {
        let bad = |what: &str| ArchiveError::decode(key, format!("legacy record {n}: {what}"));
        let obj = item.as_object().ok_or_else(|| bad("not an object"))?;
        for k in obj.keys() {
            if !["partition_key", "event_time", "sort_key", "value"].contains(&k.as_str()) {
                return Err(bad(&format!("unknown field `{k}`")));
            }
        }
        let field = |name: &str| {
            obj.get(name)
                .ok_or_else(|| bad(&format!("missing `{name}`")))
        };
        let event_time = match field("event_time")? {
            serde_json::Value::String(s) => EventTime::parse_rfc3339(s),
            serde_json::Value::Number(x) => match x.as_i64() {
                Some(us) => EventTime::from_micros(us),
                None => return Err(bad("event_time is not an integer")),
            },
            _ => return Err(bad("event_time is neither a string nor an integer")),
        }
        .map_err(|e| bad(&e.to_string()))?;
        out.push(Record {
            partition_key: PartitionKey::new(legacy_bytes(
                key,
                field("partition_key")?,
                "partition_key",
                n,
            )?)
            .map_err(|e| bad(&e.to_string()))?,
            event_time,
            sort_key: SortKey::new(legacy_bytes(key, field("sort_key")?, "sort_key", n)?)
                .map_err(|e| bad(&e.to_string()))?,
            value: legacy_bytes(key, field("value")?, "value", n)?,
        });
    }
    Ok(out)
}

fn is_legacy(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'[')
}

/// Decodes a whole payload held in memory (after the caller verified its checksum), whose
/// manifest names record schema `schema_version`.
pub(crate) fn decode_all(
    key: &str,
    bytes: &[u8],
    schema_version: u32,
) -> Result<Vec<Record>, ArchiveError> {
    if is_legacy(bytes) {
        check_layout(key, &None, schema_version)?;
        return decode_legacy(key, bytes);
    }
    let mut lines = bytes.split_inclusive(|b| *b == b'\n');
    let header = lines
        .next()
        .ok_or_else(|| ArchiveError::decode(key, "empty JSON payload (no header line)"))?;
    let layout = check_header(
        key,
        header
            .strip_suffix(b"\n")
            .ok_or_else(|| unterminated(key))?,
    )?;
    check_layout(key, &layout, schema_version)?;
    let mut bodies = Vec::new();
    for line in lines {
        bodies.push(line.strip_suffix(b"\n").ok_or_else(|| unterminated(key))?);
    }
    match &layout {
        Some(cols) => columns::decode_lines(key, cols, &bodies, 1),
        None => bodies
            .iter()
            .enumerate()
            .map(|(n, body)| decode_line(key, body, n as u64 + 1))
            .collect(),
    }
}

fn unterminated(key: &str) -> ArchiveError {
    ArchiveError::Truncated {
        key: key.to_string(),
        reason: "the last line has no newline".into(),
    }
}

struct JsonScan {
    key: String,
    manifest: Arc<Manifest>,
    reader: Arc<VerifiedReader>,
    req: ArchiveScan,
    metrics: Arc<ArchiveScanMetrics>,
    next_block: u64,
    carry: Vec<u8>,
    header_seen: bool,
    /// A v3 payload's value columns (known once the header is read).
    layout: Option<JsonColumns>,
    legacy: Option<bool>,
    rows: u64,
    whole: Sha256,
    last: Option<(i64, Vec<u8>)>,
    matched: Vec<Record>,
    out: VecDeque<RecordBatch>,
    finished_input: bool,
    done: bool,
}

impl JsonScan {
    fn blocks(&self) -> u64 {
        self.manifest.block_sha256.len() as u64
    }

    async fn read_block(&mut self) -> Result<Bytes, ArchiveError> {
        let bs = self.manifest.block_size;
        let start = self.next_block * bs;
        let end = (start + bs).min(self.manifest.byte_length);
        self.next_block += 1;
        let block = self.reader.read(start..end).await?;
        self.whole.update(&block);
        Ok(block)
    }

    fn take_record(&mut self, r: Record) -> Result<(), ArchiveError> {
        let mut check = RowCheck::new(&self.key, &self.manifest);
        check.resume(self.last.take());
        let res = check.row(
            r.partition_key.as_bytes(),
            r.event_time.as_micros(),
            r.sort_key.as_bytes(),
        );
        self.last = check.last();
        res?;
        self.rows += 1;
        if self.req.bounds.matches(&r) {
            self.matched.push(r);
        }
        if !self.req.descending && self.matched.len() >= self.req.batch_rows {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), ArchiveError> {
        if self.matched.is_empty() {
            return Ok(());
        }
        let rows = std::mem::take(&mut self.matched);
        for chunk in rows.chunks(self.req.batch_rows) {
            self.out
                .push_back(records_to_batch(chunk, self.req.include_value));
        }
        Ok(())
    }

    fn lines(&mut self, data: &[u8]) -> Result<(), ArchiveError> {
        let mut rest = data;
        // A v3 block's lines are decoded together (into typed columns, then rows).
        let mut pending: Vec<Vec<u8>> = Vec::new();
        while let Some(pos) = rest.iter().position(|b| *b == b'\n') {
            let (line, tail) = rest.split_at(pos);
            rest = &tail[1..];
            let full: Vec<u8>;
            let line: &[u8] = if self.carry.is_empty() {
                line
            } else {
                self.carry.extend_from_slice(line);
                full = std::mem::take(&mut self.carry);
                &full
            };
            if !self.header_seen {
                self.layout = check_header(&self.key, line)?;
                check_layout(&self.key, &self.layout, self.manifest.schema_version)?;
                self.header_seen = true;
                continue;
            }
            if self.layout.is_some() {
                pending.push(line.to_vec());
                continue;
            }
            let r = decode_line(&self.key, line, self.rows + 1)?;
            self.take_record(r)?;
        }
        self.carry.extend_from_slice(rest);
        if let (Some(cols), false) = (&self.layout, pending.is_empty()) {
            let bodies: Vec<&[u8]> = pending.iter().map(Vec::as_slice).collect();
            for r in columns::decode_lines(&self.key, cols, &bodies, self.rows + 1)? {
                self.take_record(r)?;
            }
        }
        Ok(())
    }

    async fn step(&mut self) -> Result<(), ArchiveError> {
        if self.next_block >= self.blocks() {
            self.finish()?;
            self.finished_input = true;
            return Ok(());
        }
        let block = self.read_block().await?;
        if self.legacy.is_none() {
            self.legacy = Some(is_legacy(&block));
        }
        if self.legacy == Some(true) {
            check_layout(&self.key, &None, self.manifest.schema_version)?;
            // The legacy array is parsed whole: gather every (verified) block first.
            let mut all = block.to_vec();
            while self.next_block < self.blocks() {
                all.extend_from_slice(&self.read_block().await?);
            }
            for r in decode_legacy(&self.key, &all)? {
                self.take_record(r)?;
            }
            self.finish()?;
            self.finished_input = true;
            return Ok(());
        }
        self.lines(&block)
    }

    fn finish(&mut self) -> Result<(), ArchiveError> {
        // Every block matched its digest; the whole-object digest must match as well (it
        // differs only when the manifest's own fields disagree).
        let actual = hex::encode(std::mem::take(&mut self.whole).finalize());
        if actual != self.manifest.sha256 {
            return Err(ArchiveError::ChecksumMismatch {
                key: self.key.clone(),
                expected: self.manifest.sha256.clone(),
                actual,
            });
        }
        if !self.carry.is_empty() {
            return Err(unterminated(&self.key));
        }
        if self.legacy != Some(true) && !self.header_seen {
            return Err(ArchiveError::decode(
                &self.key,
                "empty JSON payload (no header line)",
            ));
        }
        if self.rows != self.manifest.row_count {
            return Err(ArchiveError::RowCountMismatch {
                key: self.key.clone(),
                expected: self.manifest.row_count,
                actual: self.rows,
            });
        }
        if self.req.descending {
            self.matched.reverse();
        }
        self.flush()
    }

    async fn next_batch(&mut self) -> Option<Result<RecordBatch, ArchiveError>> {
        loop {
            if self.done {
                return None;
            }
            // Ascending scans emit batches as they fill (every row came from a verified block
            // and passed the row check); descending scans emit once the last row is known.
            if !self.req.descending || self.finished_input {
                if let Some(b) = self.out.pop_front() {
                    ArchiveScanMetrics::add(&self.metrics.rows_returned, b.num_rows() as u64);
                    return Some(Ok(b));
                }
            }
            if self.finished_input {
                self.done = true;
                return None;
            }
            if let Err(e) = self.step().await {
                self.done = true;
                return Some(Err(e));
            }
        }
    }
}

/// Opens a verified streaming scan of a JSON payload.
pub(crate) async fn scan(
    op: opendal::Operator,
    manifest: Manifest,
    req: ArchiveScan,
    metrics: Arc<ArchiveScanMetrics>,
) -> Result<BoxStream<'static, Result<RecordBatch, ArchiveError>>, ArchiveError> {
    check_stored_length(&op, &manifest, &metrics).await?;
    let manifest = Arc::new(manifest);
    let reader = Arc::new(VerifiedReader::new(op, manifest.clone(), metrics.clone()));
    let state = JsonScan {
        key: manifest.payload_key.clone(),
        manifest,
        reader,
        req,
        metrics,
        next_block: 0,
        carry: Vec::new(),
        header_seen: false,
        layout: None,
        legacy: None,
        rows: 0,
        whole: Sha256::new(),
        last: None,
        matched: Vec::new(),
        out: VecDeque::new(),
        finished_input: false,
        done: false,
    };
    Ok(futures::stream::unfold(state, |mut s| async move {
        let item = s.next_batch().await?;
        Some((item, s))
    })
    .boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_legacy_shapes_decode() {
        let r = Record {
            partition_key: PartitionKey::new(vec![0xab, 1]).unwrap(),
            event_time: EventTime::parse_rfc3339("2024-03-10T01:02:03.000004Z").unwrap(),
            sort_key: SortKey::new(Vec::new()).unwrap(),
            value: b"hi\n\"".to_vec(),
        };
        let mut buf = header_line(None);
        encode_lines("k", None, std::slice::from_ref(&r), &mut buf).unwrap();
        assert_eq!(decode_all("k", &buf, 2).unwrap(), vec![r.clone()]);
        let legacy = br#"[{"partition_key":"ab01","event_time":"2024-03-10T01:02:03.000004Z","sort_key":"","value":"68690a22"}]"#;
        assert_eq!(decode_all("k", legacy, 2).unwrap(), vec![r.clone()]);
        let legacy2 = format!(
            r#" [{{"partition_key":[171,1],"event_time":{},"sort_key":[],"value":[104,105,10,34]}}]"#,
            r.event_time.as_micros()
        );
        assert_eq!(decode_all("k", legacy2.as_bytes(), 2).unwrap(), vec![r]);
        for bad in [
            &br#"[{"partition_key":"zz","event_time":"2024-03-10T01:02:03Z","sort_key":"","value":""}]"#[..],
            br#"[{"partition_key":"ab","event_time":"2024-03-10T01:02:03Z","sort_key":"","value":"","x":1}]"#,
            br#"[{"partition_key":"ab","event_time":"yesterday","sort_key":"","value":""}]"#,
            br#"{"pulpitum_archive":"jsonl","schema_version":3,"bytes":"hex"}"#,
        ] {
            assert!(decode_all("k", bad, 2).is_err());
        }
    }

    #[test]
    fn a_header_must_be_the_layout_its_manifest_names() {
        let r = Record {
            partition_key: PartitionKey::new(vec![1]).unwrap(),
            event_time: EventTime::from_micros(5).unwrap(),
            sort_key: SortKey::new(Vec::new()).unwrap(),
            value: b"x".to_vec(),
        };
        let mut v2 = header_line(None);
        encode_lines("k", None, std::slice::from_ref(&r), &mut v2).unwrap();
        assert!(decode_all("k", &v2, 2).is_ok());
        let e = decode_all("k", &v2, 3).unwrap_err();
        assert!(e.to_string().contains("not the record schema 3"), "{e}");
        // A v3 header without its columns, or columns under v2, is refused.
        for header in [
            r#"{"pulpitum_archive":"jsonl","schema_version":3,"bytes":"hex"}"#,
            r#"{"pulpitum_archive":"jsonl","schema_version":2,"bytes":"hex","table_schema_version":1,"columns":[]}"#,
            r#"{"pulpitum_archive":"jsonl","schema_version":3,"bytes":"hex","table_schema_version":1,"columns":[{"id":2,"name":"a","type":"text"},{"id":1,"name":"b","type":"text"}]}"#,
            r#"{"pulpitum_archive":"jsonl","schema_version":3,"bytes":"hex","table_schema_version":1,"columns":[{"id":1,"name":"a","type":"money"}]}"#,
        ] {
            let bytes = format!("{header}\n");
            assert!(decode_all("k", bytes.as_bytes(), 3).is_err(), "{header}");
            assert!(decode_all("k", bytes.as_bytes(), 2).is_err(), "{header}");
        }
    }
}
