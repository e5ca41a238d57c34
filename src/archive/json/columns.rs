//! The JSON payload of a declared table (record schema v3): each line names the row's value
//! columns in its `value` object (where a v2 line has the value's hex), typed as JSON can say them, so `jq`, DuckDB's `read_json`
//! or any JSON reader reads an archived row by column name.
//!
//! ```text
//! {"pulpitum_archive":"jsonl","schema_version":3,"bytes":"hex","table_schema_version":2,"columns":[{"id":1,"name":"kind","type":"text"},{"id":2,"name":"amount","type":"double precision"}]}
//! {"partition_key":"8000000000000001","event_time":"2024-03-10T01:02:03.000004Z","sort_key":"8000000000000007","value":{"kind":"signup","amount":1.5}}
//! ```
//!
//! The rest of Pulpitum compares a row's stored bytes (`DELETE`, `UPDATE`, masks, erasure,
//! compaction), so a line must give back its row's encoded value exactly. The columns hold
//! the values of the schema the archiver wrote with, and the `residual` (lowercase hex of an
//! encoded partial row, left out when empty) holds what they cannot say, exactly as in the
//! columnar Parquet layout (`crate::archive::parquet::columns`): fields of dropped columns,
//! values from before a widening, "absent" markers of columns the row predates, and here
//! also a `JSON` value that cannot be embedded as written (one holding a line break, which
//! JSON Lines cannot carry raw); such a value is written as a JSON string in `value` for
//! other readers, and the residual's copy is the one Pulpitum reads.
//!
//! How each type is written, chosen so that every stored value parses back to the same
//! bits: booleans and integers as JSON numbers; `REAL` and `DOUBLE PRECISION` as the
//! shortest number that reads back as the same double (a `REAL` widened exactly), with `NaN`
//! and the infinities as the strings PostgreSQL prints; `NUMERIC` as a string of exactly its
//! scale's digits; `TEXT` as a string; `BYTEA` as PostgreSQL's `\x` hex string; `TIMESTAMPTZ`
//! as RFC 3339 UTC with six fractional digits and `DATE` as `YYYY-MM-DD` (both as integers,
//! microseconds or days since the epoch, outside years 1 to 9999); `JSON` embedded as
//! written. The writer decodes every chunk it encodes and compares the rows before they are
//! uploaded, so a value this misses fails the write instead of being archived wrong.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, NaiveDate, SecondsFormat};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryBuilder, BooleanBuilder, Date32Builder, Decimal128Builder,
    Float32Builder, Float64Builder, Int16Builder, Int32Builder, Int64Builder, StringBuilder,
    TimestampMicrosecondBuilder,
};
use datafusion::arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Field, Float32Type, Float64Type, Int16Type, Int32Type,
    Int64Type, Schema, TimestampMicrosecondType,
};
use datafusion::arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::archive::parquet::{to_envelope, ValueColumns, RESIDUAL};
use crate::archive::ArchiveError;
use crate::model::envelope::COL_VALUE;
use crate::model::schema::row::{encode_entry, entries, ROW_FORMAT};
use crate::model::schema::ColumnType;
use crate::model::{records_to_batch, EventTime, PartitionKey, Record, SortKey};

/// A value column as the header line names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HeaderColumn {
    id: u32,
    name: String,
    #[serde(rename = "type")]
    ty: String,
}

/// The value columns of a v3 JSON payload, in field id order.
#[derive(Debug, Clone)]
pub(crate) struct JsonColumns {
    columns: Vec<(u32, String, ColumnType)>,
}

impl JsonColumns {
    /// The header's column list for `layout`.
    pub(crate) fn header(layout: &ValueColumns) -> Vec<HeaderColumn> {
        layout
            .schema()
            .columns
            .iter()
            .map(|c| HeaderColumn {
                id: c.id,
                name: c.name.clone(),
                ty: c.ty.to_string(),
            })
            .collect()
    }

    /// The columns a header names, checked (ascending ids, known types, distinct names).
    pub(crate) fn from_header(key: &str, header: &[HeaderColumn]) -> Result<Self, ArchiveError> {
        let mut columns = Vec::with_capacity(header.len());
        let mut prev = 0;
        for c in header {
            let ty: ColumnType = c.ty.parse().map_err(|_| {
                ArchiveError::decode(
                    key,
                    format!("header: column {} has type {:?}", c.name, c.ty),
                )
            })?;
            if c.id <= prev || columns.iter().any(|(_, n, _)| n == &c.name) {
                return Err(ArchiveError::decode(
                    key,
                    format!(
                        "header: column {} (field {}) repeats or is out of order",
                        c.name, c.id
                    ),
                ));
            }
            prev = c.id;
            columns.push((c.id, c.name.clone(), ty));
        }
        Ok(Self { columns })
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line<'a> {
    #[serde(borrow)]
    partition_key: Cow<'a, str>,
    #[serde(borrow)]
    event_time: Cow<'a, str>,
    #[serde(borrow)]
    sort_key: Cow<'a, str>,
    #[serde(borrow)]
    value: HashMap<Cow<'a, str>, &'a RawValue>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    residual: Option<Cow<'a, str>>,
}

/// Appends the lines of `records` in `layout` to `out`, then decodes them again and
/// compares every row: nothing is uploaded that would not read back as stored.
pub(crate) fn encode_lines(
    key: &str,
    layout: &ValueColumns,
    records: &[Record],
    out: &mut Vec<u8>,
) -> Result<(), ArchiveError> {
    if records.is_empty() {
        return Ok(());
    }
    let env = records_to_batch(records, true);
    let payload = layout.to_payload(&env)?;
    let schema = layout.schema();
    let n = schema.columns.len();
    let typed = &payload.columns()[COL_VALUE..COL_VALUE + n];
    let residual = payload.column(COL_VALUE + n).as_binary::<i32>();
    let start = out.len();
    let mut value = String::new();
    let mut extra = Vec::new();
    for (row, r) in records.iter().enumerate() {
        out.extend_from_slice(b"{\"partition_key\":\"");
        out.extend_from_slice(r.partition_key.to_hex().as_bytes());
        out.extend_from_slice(b"\",\"event_time\":\"");
        out.extend_from_slice(
            r.event_time
                .to_datetime()
                .to_rfc3339_opts(SecondsFormat::Micros, true)
                .as_bytes(),
        );
        out.extend_from_slice(b"\",\"sort_key\":\"");
        out.extend_from_slice(hex::encode(r.sort_key.as_bytes()).as_bytes());
        out.extend_from_slice(b"\",\"value\":{");
        extra.clear();
        for (i, (c, a)) in schema.columns.iter().zip(typed).enumerate() {
            if i > 0 {
                out.push(b',');
            }
            serde_json::to_writer(&mut *out, &c.name).expect("a name serializes");
            out.push(b':');
            value.clear();
            if !write_value(&mut value, c.ty, a, row) {
                // A value JSON cannot say exactly: readable here, exact in the residual.
                encode_entry(&mut extra, c.id, c.ty, a, row);
            }
            out.extend_from_slice(value.as_bytes());
        }
        out.push(b'}');
        let res = merged_residual(key, residual.value(row), &extra)?;
        if !res.is_empty() {
            out.extend_from_slice(b",\"residual\":\"");
            out.extend_from_slice(hex::encode(&res).as_bytes());
            out.push(b'"');
        }
        out.extend_from_slice(b"}\n");
    }
    // The check: the lines just written, decoded as a reader will, give back every row.
    let cols = JsonColumns {
        columns: schema
            .columns
            .iter()
            .map(|c| (c.id, c.name.clone(), c.ty))
            .collect(),
    };
    let mut back = Vec::with_capacity(records.len());
    for (n, line) in out[start..].split(|b| *b == b'\n').enumerate() {
        if n < records.len() {
            back.push(line);
        }
    }
    let decoded = decode_lines(key, &cols, &back, 1)?;
    if decoded.as_slice() != records {
        return Err(ArchiveError::decode(
            key,
            "the JSON lines do not give back the stored rows; not written",
        ));
    }
    Ok(())
}

/// A residual with `extra` (whole entries, ascending ids) merged in.
fn merged_residual(key: &str, res: &[u8], extra: &[u8]) -> Result<Vec<u8>, ArchiveError> {
    if extra.is_empty() {
        return Ok(res.to_vec());
    }
    let mut head = vec![ROW_FORMAT];
    head.extend_from_slice(extra);
    let bad = |e: crate::model::schema::row::RowError| ArchiveError::decode(key, e.to_string());
    let kept = if res.is_empty() {
        Vec::new()
    } else {
        entries(res, true).map_err(bad)?
    };
    // A field the residual holds already (a value from before a widening) is exact there.
    let mut all: Vec<_> = entries(&head, false)
        .map_err(bad)?
        .into_iter()
        .filter(|e| !kept.iter().any(|k| k.id == e.id))
        .collect();
    all.extend(kept);
    all.sort_by_key(|e| e.id);
    let mut out = vec![ROW_FORMAT];
    for e in all {
        out.extend_from_slice(e.bytes);
    }
    Ok(out)
}

/// Writes row `row` of `a` (a column of `ty`) as JSON; `false` when what it wrote does not
/// read back as the same bits (a JSON text that cannot be embedded as written, written as a
/// string; a NaN other than the canonical one), so the exact value must go in the residual.
fn write_value(out: &mut String, ty: ColumnType, a: &ArrayRef, row: usize) -> bool {
    use std::fmt::Write;
    if a.is_null(row) {
        out.push_str("null");
        return true;
    }
    let string = |out: &mut String, s: &str| {
        out.push_str(&serde_json::to_string(s).expect("a string serializes"));
    };
    match ty {
        ColumnType::Boolean => out.push_str(if a.as_boolean().value(row) {
            "true"
        } else {
            "false"
        }),
        ColumnType::Int16 => write!(out, "{}", a.as_primitive::<Int16Type>().value(row)).unwrap(),
        ColumnType::Int32 => write!(out, "{}", a.as_primitive::<Int32Type>().value(row)).unwrap(),
        ColumnType::Int64 => write!(out, "{}", a.as_primitive::<Int64Type>().value(row)).unwrap(),
        ColumnType::Float32 => {
            let v = a.as_primitive::<Float32Type>().value(row);
            float(out, f64::from(v));
            // A NaN reads back as the canonical one; any other NaN's bits are kept apart.
            return !v.is_nan() || v.to_bits() == f32::NAN.to_bits();
        }
        ColumnType::Float64 => {
            let v = a.as_primitive::<Float64Type>().value(row);
            float(out, v);
            return !v.is_nan() || v.to_bits() == f64::NAN.to_bits();
        }
        ColumnType::Decimal { scale, .. } => {
            let v = a.as_primitive::<Decimal128Type>().value(row);
            string(out, &format_decimal(v, scale));
        }
        ColumnType::Text => string(out, a.as_string::<i32>().value(row)),
        ColumnType::Bytea => string(
            out,
            &format!("\\x{}", hex::encode(a.as_binary::<i32>().value(row))),
        ),
        ColumnType::TimestampTz => {
            let us = a.as_primitive::<TimestampMicrosecondType>().value(row);
            match DateTime::from_timestamp_micros(us).filter(|t| in_years(t.date_naive())) {
                Some(t) => string(out, &t.to_rfc3339_opts(SecondsFormat::Micros, true)),
                None => write!(out, "{us}").unwrap(),
            }
        }
        ColumnType::Date => {
            let d = a.as_primitive::<Date32Type>().value(row);
            match date_of(d).filter(|d| in_years(*d)) {
                Some(day) => string(out, &day.format("%Y-%m-%d").to_string()),
                None => write!(out, "{d}").unwrap(),
            }
        }
        ColumnType::Json => {
            let text = a.as_string::<i32>().value(row);
            // `null` would read as SQL NULL; a line break cannot be carried raw; other
            // readers refuse deep nesting and lone surrogate escapes (break-it finding:
            // one such value made DuckDB and jq refuse the whole payload).
            let embeddable = text != "null"
                && !text.contains(['\n', '\r'])
                && other_readers_take(text)
                && serde_json::from_str::<&RawValue>(text).is_ok_and(|v| v.get() == text);
            if embeddable {
                out.push_str(text);
            } else {
                string(out, text);
                return false;
            }
        }
    }
    true
}

/// Nesting at most this deep is embedded (DuckDB's limit is 128, Python's and jq's more).
const EMBED_DEPTH: usize = 64;

/// Whether common JSON readers take `text` (valid JSON) embedded: nesting at most
/// [`EMBED_DEPTH`] deep, and no `\uD800`-`\uDFFF` escape (a surrogate, paired or not; DuckDB
/// and jq refuse lone ones).
fn other_readers_take(text: &str) -> bool {
    let b = text.as_bytes();
    let (mut depth, mut in_string, mut i) = (0usize, false, 0);
    while i < b.len() {
        match (in_string, b[i]) {
            (true, b'\\') => {
                if b.get(i + 1) == Some(&b'u')
                    && matches!(b.get(i + 2), Some(b'd' | b'D'))
                    && matches!(b.get(i + 3), Some(b'8'..=b'9' | b'a'..=b'f' | b'A'..=b'F'))
                {
                    return false;
                }
                i += 1;
            }
            (_, b'"') => in_string = !in_string,
            (false, b'[' | b'{') => {
                depth += 1;
                if depth > EMBED_DEPTH {
                    return false;
                }
            }
            (false, b']' | b'}') => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    true
}

fn float(out: &mut String, v: f64) {
    if v.is_finite() {
        // serde_json writes the shortest text that parses back to the same double.
        out.push_str(&serde_json::to_string(&v).expect("a finite float serializes"));
    } else if v.is_nan() {
        out.push_str("\"NaN\"");
    } else if v > 0.0 {
        out.push_str("\"Infinity\"");
    } else {
        out.push_str("\"-Infinity\"");
    }
}

fn in_years(d: NaiveDate) -> bool {
    use chrono::Datelike;
    (1..=9999).contains(&d.year())
}

fn date_of(days: i32) -> Option<NaiveDate> {
    NaiveDate::from_ymd_opt(1970, 1, 1)?
        .checked_add_signed(chrono::TimeDelta::try_days(i64::from(days))?)
}

/// An unscaled decimal as text with exactly `scale` fractional digits (a negative scale
/// appends zeros).
fn format_decimal(v: i128, scale: i8) -> String {
    let digits = v.unsigned_abs().to_string();
    let sign = if v < 0 { "-" } else { "" };
    if scale <= 0 {
        if v == 0 {
            return "0".into();
        }
        return format!(
            "{sign}{digits}{}",
            "0".repeat(scale.unsigned_abs() as usize)
        );
    }
    let s = scale as usize;
    let padded = format!("{digits:0>width$}", width = s + 1);
    let (int, frac) = padded.split_at(padded.len() - s);
    format!("{sign}{int}.{frac}")
}

/// The unscaled value of text [`format_decimal`] wrote for `scale`.
fn parse_decimal(text: &str, scale: i8) -> Option<i128> {
    let (neg, body) = match text.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, text),
    };
    let digits: String = if scale > 0 {
        let (int, frac) = body.split_once('.')?;
        if frac.len() != scale as usize || int.is_empty() {
            return None;
        }
        format!("{int}{frac}")
    } else {
        let zeros = scale.unsigned_abs() as usize;
        if body == "0" {
            return (!neg).then_some(0);
        }
        body.strip_suffix(&"0".repeat(zeros))?.to_string()
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: i128 = digits.parse().ok()?;
    Some(if neg { -v } else { v })
}

/// Decodes lines (without their newlines) into records; `first` is the first line's number
/// for messages.
pub(crate) fn decode_lines(
    key: &str,
    cols: &JsonColumns,
    lines: &[&[u8]],
    first: u64,
) -> Result<Vec<Record>, ArchiveError> {
    let bad = |n: usize, what: String| {
        ArchiveError::decode(key, format!("record line {}: {what}", first + n as u64))
    };
    let mut parsed = Vec::with_capacity(lines.len());
    for (n, line) in lines.iter().enumerate() {
        let l: Line<'_> = serde_json::from_slice(line).map_err(|e| bad(n, e.to_string()))?;
        if l.value.len() != cols.columns.len() {
            return Err(bad(
                n,
                format!(
                    "{} values for {} columns",
                    l.value.len(),
                    cols.columns.len()
                ),
            ));
        }
        parsed.push(l);
    }
    let mut fields = Vec::with_capacity(cols.columns.len() + 1);
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(cols.columns.len() + 1);
    for (_, name, ty) in &cols.columns {
        let mut raws = Vec::with_capacity(parsed.len());
        for (n, l) in parsed.iter().enumerate() {
            raws.push(
                *l.value
                    .get(name.as_str())
                    .ok_or_else(|| bad(n, format!("no value for column {name}")))?,
            );
        }
        arrays.push(column(*ty, &raws).map_err(|(n, why)| bad(n, format!("{name}: {why}")))?);
        fields.push(Field::new(name, ty.arrow(), true));
    }
    let mut residual = BinaryBuilder::with_capacity(parsed.len(), 0);
    for (n, l) in parsed.iter().enumerate() {
        match &l.residual {
            Some(h) => residual.append_value(
                hex::decode(h.as_ref()).map_err(|e| bad(n, format!("residual: {e}")))?,
            ),
            None => residual.append_value([]),
        }
    }
    arrays.push(Arc::new(residual.finish()));
    fields.push(Field::new(RESIDUAL, DataType::Binary, false));
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
        .map_err(|e| ArchiveError::decode(key, e))?;
    let ids: Vec<(u32, ColumnType)> = cols.columns.iter().map(|(id, _, ty)| (*id, *ty)).collect();
    let values = to_envelope(key, &ids, &batch, 0, None)?;
    let values = values[0].as_binary::<i32>();
    let mut out = Vec::with_capacity(parsed.len());
    for (n, l) in parsed.iter().enumerate() {
        let hexed =
            |name: &str, s: &str| hex::decode(s).map_err(|e| bad(n, format!("{name}: {e}")));
        out.push(Record {
            partition_key: PartitionKey::new(hexed("partition_key", &l.partition_key)?)
                .map_err(|e| bad(n, e.to_string()))?,
            event_time: EventTime::parse_rfc3339(&l.event_time)
                .map_err(|e| bad(n, e.to_string()))?,
            sort_key: SortKey::new(hexed("sort_key", &l.sort_key)?)
                .map_err(|e| bad(n, e.to_string()))?,
            value: values.value(n).to_vec(),
        });
    }
    Ok(out)
}

/// The typed array of one column's values; an error names the line (0-based) and why.
fn column(ty: ColumnType, raws: &[&RawValue]) -> Result<ArrayRef, (usize, String)> {
    fn parse<'a, T: Deserialize<'a>>(
        n: usize,
        r: &'a RawValue,
        what: &str,
    ) -> Result<T, (usize, String)> {
        serde_json::from_str(r.get()).map_err(|e| (n, format!("not {what}: {e}")))
    }
    let is_null = |r: &RawValue| r.get() == "null";
    macro_rules! build {
        ($builder:expr, |$n:ident, $r:ident| $value:expr) => {{
            let mut b = $builder;
            for ($n, $r) in raws.iter().enumerate() {
                if is_null($r) {
                    b.append_null();
                } else {
                    b.append_value($value);
                }
            }
            Arc::new(b.finish()) as ArrayRef
        }};
    }
    let float = |n: usize, r: &RawValue| -> Result<f64, (usize, String)> {
        match r.get() {
            "\"NaN\"" => Ok(f64::NAN),
            "\"Infinity\"" => Ok(f64::INFINITY),
            "\"-Infinity\"" => Ok(f64::NEG_INFINITY),
            _ => parse::<f64>(n, r, "a number"),
        }
    };
    Ok(match ty {
        ColumnType::Boolean => build!(BooleanBuilder::new(), |n, r| parse::<bool>(
            n,
            r,
            "a boolean"
        )?),
        ColumnType::Int16 => build!(Int16Builder::new(), |n, r| parse::<i16>(
            n,
            r,
            "a smallint"
        )?),
        ColumnType::Int32 => build!(Int32Builder::new(), |n, r| parse::<i32>(
            n,
            r,
            "an integer"
        )?),
        ColumnType::Int64 => build!(Int64Builder::new(), |n, r| parse::<i64>(n, r, "a bigint")?),
        ColumnType::Float32 => build!(Float32Builder::new(), |n, r| {
            let v = float(n, r)?;
            let narrow = if v.is_nan() { f32::NAN } else { v as f32 };
            if !v.is_nan() && f64::from(narrow) != v {
                return Err((n, format!("{v} is not a real")));
            }
            narrow
        }),
        ColumnType::Float64 => build!(Float64Builder::new(), |n, r| float(n, r)?),
        ColumnType::Decimal { precision, scale } => build!(
            Decimal128Builder::new()
                .with_precision_and_scale(precision, scale)
                .map_err(|e| (0, e.to_string()))?,
            |n, r| {
                let s: String = parse(n, r, "a numeric string")?;
                parse_decimal(&s, scale)
                    .ok_or_else(|| (n, format!("{s:?} is not a numeric of scale {scale}")))?
            }
        ),
        ColumnType::Text => build!(StringBuilder::new(), |n, r| parse::<String>(
            n, r, "a string"
        )?),
        ColumnType::Bytea => build!(BinaryBuilder::new(), |n, r| {
            let s: String = parse(n, r, "a bytea string")?;
            s.strip_prefix("\\x")
                .and_then(|h| hex::decode(h).ok())
                .ok_or_else(|| (n, "not a \\x hex string".to_string()))?
        }),
        ColumnType::TimestampTz => build!(
            TimestampMicrosecondBuilder::new().with_timezone("UTC"),
            |n, r| if r.get().starts_with('"') {
                let s: String = parse(n, r, "a timestamp")?;
                DateTime::parse_from_rfc3339(&s)
                    .map_err(|e| (n, format!("{s:?}: {e}")))?
                    .timestamp_micros()
            } else {
                parse::<i64>(n, r, "microseconds")?
            }
        ),
        ColumnType::Date => build!(Date32Builder::new(), |n, r| if r.get().starts_with('"') {
            let s: String = parse(n, r, "a date")?;
            let d = NaiveDate::parse_from_str(&s, "%Y-%m-%d")
                .map_err(|e| (n, format!("{s:?}: {e}")))?;
            let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).expect("the epoch");
            i32::try_from((d - epoch).num_days()).map_err(|_| (n, format!("{s:?} out of range")))?
        } else {
            parse::<i32>(n, r, "days")?
        }),
        // Embedded as written: the raw text is the value. (One written as a string has its
        // exact value in the residual, which takes precedence.)
        ColumnType::Json => build!(StringBuilder::new(), |n, r| {
            let _ = n;
            r.get()
        }),
    })
}

#[cfg(test)]
#[path = "columns_tests.rs"]
mod tests;
