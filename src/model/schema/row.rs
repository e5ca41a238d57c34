//! Record schema v3: a declared table's value columns encoded as one row of bytes, the
//! record's `value` in both tiers.
//!
//! # Encoding
//!
//! `0x03`, then one entry per column the writer's schema had, in ascending field id:
//! the field id as an unsigned LEB128 varint, a type tag, and the value:
//!
//! | tag | type | value |
//! |---|---|---|
//! | 0 | `NULL` | nothing |
//! | 1 | boolean | one byte, 0 or 1 |
//! | 2, 3, 4 | smallint, integer, bigint | 2, 4, 8 bytes little-endian |
//! | 5, 6 | real, double | 4, 8 bytes little-endian IEEE 754 |
//! | 7 | numeric | the unscaled value, 16 bytes little-endian (the scale is the column's) |
//! | 8, 9, 12 | text, bytea, json | varint length, then the bytes (UTF-8 for text and json) |
//! | 10 | timestamptz | microseconds since the epoch, 8 bytes little-endian |
//! | 11 | date | days since the epoch, 4 bytes little-endian |
//!
//! Why this and not Avro, Protocol Buffers or MessagePack: a reader needs no writer schema
//! (Avro does) and the tag keeps the exact SQL type (protobuf's wire types do not tell an
//! `INTEGER` from a `BIGINT`, or a `BIGINT` from a `DOUBLE`), so a widening is checked
//! per value, and a reader resolves every field by id against its own schema: a field it
//! does not know (a dropped column) is skipped, a field it lacks (a column added later)
//! reads as the column's missing value. A `NULL` is written (tag 0) rather than left out, so
//! it stays distinct from "written before the column existed". The writer is canonical:
//! the same row under the same schema is the same bytes.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BinaryBuilder, BooleanBuilder, Date32Builder,
    Decimal128Builder, Float32Builder, Float64Builder, Int16Builder, Int32Builder, Int64Builder,
    StringBuilder, TimestampMicrosecondBuilder,
};
use datafusion::arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Float32Type, Float64Type, Int16Type, Int32Type,
    Int64Type, TimeUnit, TimestampMicrosecondType,
};

use super::{ColumnDef, ColumnType, TableSchema, Value};

/// The first byte of every v3 row.
pub const ROW_FORMAT: u8 = 0x03;

/// Every way a row can fail to encode or decode. Each names the column and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowError {
    /// A value an insert or update cannot store.
    #[error("column {column}: {reason}")]
    Invalid {
        /// The column.
        column: String,
        /// Why.
        reason: String,
    },
    /// Stored bytes that are not a v3 row of this table.
    #[error("stored row is not a valid record schema v3 row: {0}")]
    Corrupt(String),
}

const T_NULL: u8 = 0;
const T_BOOL: u8 = 1;
const T_I16: u8 = 2;
const T_I32: u8 = 3;
const T_I64: u8 = 4;
const T_F32: u8 = 5;
const T_F64: u8 = 6;
const T_DEC: u8 = 7;
const T_TEXT: u8 = 8;
const T_BYTES: u8 = 9;
const T_TS: u8 = 10;
const T_DATE: u8 = 11;
const T_JSON: u8 = 12;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Encodes rows of a batch's value columns. `columns[i]` is the array of
/// `schema.columns[i]`, in the column's SQL type (as [`ColumnType::arrow`] names it).
pub struct RowEncoder<'a> {
    schema: &'a TableSchema,
    columns: &'a [ArrayRef],
}

impl<'a> RowEncoder<'a> {
    /// An encoder over one batch's value columns; refuses columns of the wrong type.
    pub fn new(schema: &'a TableSchema, columns: &'a [ArrayRef]) -> Result<Self, RowError> {
        if columns.len() != schema.columns.len() {
            return Err(RowError::Invalid {
                column: "*".into(),
                reason: format!(
                    "{} value columns given, the table has {}",
                    columns.len(),
                    schema.columns.len()
                ),
            });
        }
        for (c, a) in schema.columns.iter().zip(columns) {
            if a.data_type() != &c.ty.arrow() {
                return Err(RowError::Invalid {
                    column: c.name.clone(),
                    reason: format!("has type {}, expected {}", a.data_type(), c.ty),
                });
            }
        }
        Ok(Self { schema, columns })
    }

    /// Row `row` as value bytes.
    pub fn encode(&self, row: usize) -> Result<Vec<u8>, RowError> {
        let mut out = Vec::with_capacity(16 + 12 * self.columns.len());
        out.push(ROW_FORMAT);
        // Columns are kept in field id order: `ADD COLUMN` appends with the next id.
        for (c, a) in self.schema.columns.iter().zip(self.columns) {
            put_varint(&mut out, u64::from(c.id));
            if a.is_null(row) {
                if !c.nullable {
                    return Err(RowError::Invalid {
                        column: c.name.clone(),
                        reason: "must not be NULL".into(),
                    });
                }
                out.push(T_NULL);
                continue;
            }
            encode_value(&mut out, c, a, row)?;
        }
        Ok(out)
    }
}

fn encode_value(
    out: &mut Vec<u8>,
    c: &ColumnDef,
    a: &ArrayRef,
    row: usize,
) -> Result<(), RowError> {
    encode_checked(out, c, a, row, true)
}

/// The tag a value of `t` is written with.
pub fn natural_tag(t: ColumnType) -> u8 {
    match t {
        ColumnType::Boolean => T_BOOL,
        ColumnType::Int16 => T_I16,
        ColumnType::Int32 => T_I32,
        ColumnType::Int64 => T_I64,
        ColumnType::Float32 => T_F32,
        ColumnType::Float64 => T_F64,
        ColumnType::Decimal { .. } => T_DEC,
        ColumnType::Text => T_TEXT,
        ColumnType::Bytea => T_BYTES,
        ColumnType::TimestampTz => T_TS,
        ColumnType::Date => T_DATE,
        ColumnType::Json => T_JSON,
    }
}

/// The tag of an "absent" marker: a field the row did not have (written before its column
/// existed). Never in a stored row; only in the residual of a columnar payload
/// (`crate::archive::parquet`), which must say which fields to leave out when it rebuilds
/// the row.
pub const ABSENT_TAG: u8 = 0xff;

/// Writes one entry (field id, tag, value) for row `row` of `a`, a column of type `ty`,
/// without the checks of an insert (the value was read from a stored row): the exact bytes
/// [`RowEncoder`] writes for it.
pub fn encode_entry(out: &mut Vec<u8>, id: u32, ty: ColumnType, a: &ArrayRef, row: usize) {
    put_varint(out, u64::from(id));
    if a.is_null(row) {
        out.push(T_NULL);
        return;
    }
    let c = ColumnDef {
        id,
        name: String::new(),
        ty,
        nullable: true,
        missing: None,
        default: None,
    };
    encode_checked(out, &c, a, row, false).expect("unchecked encoding cannot fail");
}

/// One entry of a stored row: its field id, tag and whole bytes (id, tag and value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The field id.
    pub id: u32,
    /// The type tag ([`ABSENT_TAG`] for a marker).
    pub tag: u8,
    /// The entry as stored.
    pub bytes: &'a [u8],
}

/// The entries of an encoded row, checked (ascending ids, known tags, lengths); with
/// `absent_markers`, [`ABSENT_TAG`] entries are accepted too.
pub fn entries(row: &[u8], absent_markers: bool) -> Result<Vec<Entry<'_>>, RowError> {
    let mut r = Reader { b: row, at: 0 };
    let head = r.take(1)?[0];
    if head != ROW_FORMAT {
        return Err(RowError::Corrupt(format!(
            "first byte 0x{head:02x} is not the v3 row format 0x03"
        )));
    }
    let mut out = Vec::new();
    let mut last = 0u64;
    while r.at < r.b.len() {
        let start = r.at;
        let id = r.varint()?;
        if id <= last || id > u64::from(u32::MAX) {
            return Err(RowError::Corrupt(format!("field id {id} after {last}")));
        }
        last = id;
        let tag_at = r.at;
        if absent_markers && r.b.get(r.at) == Some(&ABSENT_TAG) {
            r.at += 1;
        } else {
            r.raw()?;
        }
        out.push(Entry {
            id: id as u32,
            tag: r.b[tag_at],
            bytes: &r.b[start..r.at],
        });
    }
    Ok(out)
}

/// `new` (a row just encoded from a session's schema) with every entry of `stored` (the
/// row it replaces) whose field is not `known` to that schema carried over, in field id
/// order: an `UPDATE` planned before a column was added keeps that column's value.
pub fn carry_unknown(
    new: &[u8],
    stored: &[u8],
    known: &dyn Fn(u32) -> bool,
) -> Result<Vec<u8>, RowError> {
    let new_entries = entries(new, false)?;
    let kept: Vec<Entry<'_>> = entries(stored, false)?
        .into_iter()
        .filter(|e| !known(e.id))
        .collect();
    if kept.is_empty() {
        return Ok(new.to_vec());
    }
    let mut all: Vec<Entry<'_>> = new_entries.into_iter().chain(kept).collect();
    all.sort_by_key(|e| e.id);
    let mut out = Vec::with_capacity(new.len() + stored.len());
    out.push(ROW_FORMAT);
    for (i, e) in all.iter().enumerate() {
        if i > 0 && all[i - 1].id == e.id {
            return Err(RowError::Corrupt(format!("field {} twice", e.id)));
        }
        out.extend_from_slice(e.bytes);
    }
    Ok(out)
}

fn encode_checked(
    out: &mut Vec<u8>,
    c: &ColumnDef,
    a: &ArrayRef,
    row: usize,
    check: bool,
) -> Result<(), RowError> {
    match c.ty {
        ColumnType::Boolean => {
            out.push(T_BOOL);
            out.push(u8::from(a.as_boolean().value(row)));
        }
        ColumnType::Int16 => {
            out.push(T_I16);
            out.extend(a.as_primitive::<Int16Type>().value(row).to_le_bytes());
        }
        ColumnType::Int32 => {
            out.push(T_I32);
            out.extend(a.as_primitive::<Int32Type>().value(row).to_le_bytes());
        }
        ColumnType::Int64 => {
            out.push(T_I64);
            out.extend(a.as_primitive::<Int64Type>().value(row).to_le_bytes());
        }
        ColumnType::Float32 => {
            out.push(T_F32);
            out.extend(a.as_primitive::<Float32Type>().value(row).to_le_bytes());
        }
        ColumnType::Float64 => {
            out.push(T_F64);
            out.extend(a.as_primitive::<Float64Type>().value(row).to_le_bytes());
        }
        ColumnType::Decimal { precision, .. } => {
            let v = a.as_primitive::<Decimal128Type>().value(row);
            if check && v.unsigned_abs() >= 10u128.pow(u32::from(precision)) {
                return Err(RowError::Invalid {
                    column: c.name.clone(),
                    reason: format!("{v} (unscaled) has more than {precision} digits"),
                });
            }
            out.push(T_DEC);
            out.extend(v.to_le_bytes());
        }
        ColumnType::Text => {
            out.push(T_TEXT);
            put_bytes(out, a.as_string::<i32>().value(row).as_bytes());
        }
        ColumnType::Json => {
            let s = a.as_string::<i32>().value(row);
            if check {
                if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(s) {
                    return Err(RowError::Invalid {
                        column: c.name.clone(),
                        reason: format!("is not valid JSON ({e})"),
                    });
                }
            }
            out.push(T_JSON);
            put_bytes(out, s.as_bytes());
        }
        ColumnType::Bytea => {
            out.push(T_BYTES);
            put_bytes(out, a.as_binary::<i32>().value(row));
        }
        ColumnType::TimestampTz => {
            out.push(T_TS);
            out.extend(
                a.as_primitive::<TimestampMicrosecondType>()
                    .value(row)
                    .to_le_bytes(),
            );
        }
        ColumnType::Date => {
            out.push(T_DATE);
            out.extend(a.as_primitive::<Date32Type>().value(row).to_le_bytes());
        }
    }
    Ok(())
}

/// A stored value, as read from a row.
#[derive(Debug, Clone, Copy)]
enum Raw<'a> {
    Null,
    Bool(bool),
    I16(i16),
    I32(i32),
    I64(i64),
    F32(f32),
    F64(f64),
    Dec(i128),
    Text(&'a [u8]),
    Bytes(&'a [u8]),
    Ts(i64),
    Date(i32),
    Json(&'a [u8]),
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], RowError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.b.len())
            .ok_or_else(|| RowError::Corrupt(format!("truncated at byte {}", self.at)))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], RowError> {
        Ok(self.take(N)?.try_into().expect("length checked"))
    }

    fn varint(&mut self) -> Result<u64, RowError> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.take(1)?[0];
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(RowError::Corrupt("varint longer than 64 bits".into()))
    }

    fn raw(&mut self) -> Result<Raw<'a>, RowError> {
        let tag = self.take(1)?[0];
        Ok(match tag {
            T_NULL => Raw::Null,
            T_BOOL => match self.take(1)?[0] {
                0 => Raw::Bool(false),
                1 => Raw::Bool(true),
                b => return Err(RowError::Corrupt(format!("boolean byte {b}"))),
            },
            T_I16 => Raw::I16(i16::from_le_bytes(self.fixed()?)),
            T_I32 => Raw::I32(i32::from_le_bytes(self.fixed()?)),
            T_I64 => Raw::I64(i64::from_le_bytes(self.fixed()?)),
            T_F32 => Raw::F32(f32::from_le_bytes(self.fixed()?)),
            T_F64 => Raw::F64(f64::from_le_bytes(self.fixed()?)),
            T_DEC => Raw::Dec(i128::from_le_bytes(self.fixed()?)),
            T_TS => Raw::Ts(i64::from_le_bytes(self.fixed()?)),
            T_DATE => Raw::Date(i32::from_le_bytes(self.fixed()?)),
            T_TEXT | T_BYTES | T_JSON => {
                let n = usize::try_from(self.varint()?)
                    .map_err(|_| RowError::Corrupt("length overflows".into()))?;
                let s = self.take(n)?;
                match tag {
                    T_TEXT => Raw::Text(s),
                    T_BYTES => Raw::Bytes(s),
                    _ => Raw::Json(s),
                }
            }
            t => return Err(RowError::Corrupt(format!("unknown type tag {t}"))),
        })
    }
}

/// One output column's builder.
enum Out {
    Bool(BooleanBuilder),
    I16(Int16Builder),
    I32(Int32Builder),
    I64(Int64Builder),
    F32(Float32Builder),
    F64(Float64Builder),
    Dec(Decimal128Builder),
    Text(StringBuilder),
    Bytes(BinaryBuilder),
    Ts(TimestampMicrosecondBuilder),
    Date(Date32Builder),
}

impl Out {
    fn new(t: ColumnType, rows: usize) -> Self {
        match t {
            ColumnType::Boolean => Self::Bool(BooleanBuilder::with_capacity(rows)),
            ColumnType::Int16 => Self::I16(Int16Builder::with_capacity(rows)),
            ColumnType::Int32 => Self::I32(Int32Builder::with_capacity(rows)),
            ColumnType::Int64 => Self::I64(Int64Builder::with_capacity(rows)),
            ColumnType::Float32 => Self::F32(Float32Builder::with_capacity(rows)),
            ColumnType::Float64 => Self::F64(Float64Builder::with_capacity(rows)),
            ColumnType::Decimal { .. } => Self::Dec(Decimal128Builder::with_capacity(rows)),
            ColumnType::Text | ColumnType::Json => {
                Self::Text(StringBuilder::with_capacity(rows, rows * 16))
            }
            ColumnType::Bytea => Self::Bytes(BinaryBuilder::with_capacity(rows, rows * 16)),
            ColumnType::TimestampTz => Self::Ts(TimestampMicrosecondBuilder::with_capacity(rows)),
            ColumnType::Date => Self::Date(Date32Builder::with_capacity(rows)),
        }
    }

    fn null(&mut self) {
        match self {
            Self::Bool(b) => b.append_null(),
            Self::I16(b) => b.append_null(),
            Self::I32(b) => b.append_null(),
            Self::I64(b) => b.append_null(),
            Self::F32(b) => b.append_null(),
            Self::F64(b) => b.append_null(),
            Self::Dec(b) => b.append_null(),
            Self::Text(b) => b.append_null(),
            Self::Bytes(b) => b.append_null(),
            Self::Ts(b) => b.append_null(),
            Self::Date(b) => b.append_null(),
        }
    }

    /// Appends a stored value, widened to the column's type; `false` when the stored type
    /// does not widen to it.
    fn push(&mut self, v: Raw<'_>) -> Result<bool, RowError> {
        let utf8 = |s: &[u8]| {
            std::str::from_utf8(s)
                .map(str::to_string)
                .map_err(|e| RowError::Corrupt(format!("text is not UTF-8 ({e})")))
        };
        match (self, v) {
            (s, Raw::Null) => s.null(),
            (Self::Bool(b), Raw::Bool(x)) => b.append_value(x),
            (Self::I16(b), Raw::I16(x)) => b.append_value(x),
            (Self::I32(b), Raw::I16(x)) => b.append_value(i32::from(x)),
            (Self::I32(b), Raw::I32(x)) => b.append_value(x),
            (Self::I64(b), Raw::I16(x)) => b.append_value(i64::from(x)),
            (Self::I64(b), Raw::I32(x)) => b.append_value(i64::from(x)),
            (Self::I64(b), Raw::I64(x)) => b.append_value(x),
            (Self::F32(b), Raw::F32(x)) => b.append_value(x),
            (Self::F64(b), Raw::F32(x)) => b.append_value(f64::from(x)),
            (Self::F64(b), Raw::F64(x)) => b.append_value(x),
            (Self::F64(b), Raw::I16(x)) => b.append_value(f64::from(x)),
            (Self::F64(b), Raw::I32(x)) => b.append_value(f64::from(x)),
            (Self::Dec(b), Raw::Dec(x)) => b.append_value(x),
            (Self::Text(b), Raw::Text(x) | Raw::Json(x)) => b.append_value(utf8(x)?),
            (Self::Bytes(b), Raw::Bytes(x)) => b.append_value(x),
            (Self::Ts(b), Raw::Ts(x)) => b.append_value(x),
            (Self::Date(b), Raw::Date(x)) => b.append_value(x),
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn push_value(&mut self, v: &Value, t: ColumnType) -> Result<(), RowError> {
        let bad = || RowError::Corrupt(format!("constant {v:?} is not a {t}"));
        match (&mut *self, v) {
            (s, Value::Null) => s.null(),
            (Self::Bool(b), Value::Boolean(x)) => b.append_value(*x),
            (Self::I16(b), Value::Int(x)) => b.append_value(i16::try_from(*x).map_err(|_| bad())?),
            (Self::I32(b), Value::Int(x)) => b.append_value(i32::try_from(*x).map_err(|_| bad())?),
            (Self::I64(b), Value::Int(x)) => b.append_value(*x),
            (Self::F32(b), Value::Float(x)) => b.append_value(*x as f32),
            (Self::F64(b), Value::Float(x)) => b.append_value(*x),
            (Self::F64(b), Value::Int(x)) => b.append_value(*x as f64),
            (Self::Dec(b), Value::Decimal(d)) => b.append_value(d.parse().map_err(|_| bad())?),
            (Self::Text(b), Value::Text(x)) => b.append_value(x),
            (Self::Bytes(b), Value::Bytes(x)) => b.append_value(x),
            (Self::Ts(b), Value::TimestampMicros(x)) => b.append_value(*x),
            (Self::Date(b), Value::Date(x)) => b.append_value(*x),
            _ => return Err(bad()),
        }
        Ok(())
    }

    fn finish(self, t: ColumnType) -> ArrayRef {
        match self {
            Self::Bool(mut b) => Arc::new(b.finish()),
            Self::I16(mut b) => Arc::new(b.finish()),
            Self::I32(mut b) => Arc::new(b.finish()),
            Self::I64(mut b) => Arc::new(b.finish()),
            Self::F32(mut b) => Arc::new(b.finish()),
            Self::F64(mut b) => Arc::new(b.finish()),
            Self::Dec(mut b) => {
                let DataType::Decimal128(p, s) = t.arrow() else {
                    unreachable!("a decimal column")
                };
                Arc::new(
                    b.finish()
                        .with_precision_and_scale(p, s)
                        .expect("validated precision and scale"),
                )
            }
            Self::Text(mut b) => Arc::new(b.finish()),
            Self::Bytes(mut b) => Arc::new(b.finish()),
            Self::Ts(mut b) => Arc::new(b.finish().with_data_type(DataType::Timestamp(
                TimeUnit::Microsecond,
                Some("UTC".into()),
            ))),
            Self::Date(mut b) => Arc::new(b.finish()),
        }
    }
}

/// Decodes the value column of envelope batches into some of a table's value columns.
#[derive(Debug, Clone)]
pub struct RowDecoder {
    /// The wanted columns (clones of the schema's), in output order.
    wanted: Vec<ColumnDef>,
    /// Output position of each field id, `usize::MAX` for a field not wanted.
    slot: Vec<usize>,
}

impl RowDecoder {
    /// A decoder producing `schema.columns[i]` for each `i` in `wanted`, in that order.
    pub fn new(schema: &TableSchema, wanted: &[usize]) -> Self {
        let wanted: Vec<ColumnDef> = wanted.iter().map(|&i| schema.columns[i].clone()).collect();
        let mut slot = vec![usize::MAX; schema.next_field_id as usize];
        for (pos, c) in wanted.iter().enumerate() {
            slot[c.id as usize] = pos;
        }
        Self { wanted, slot }
    }

    /// The wanted columns of every row of `values` (the envelope's value column).
    pub fn decode(&self, values: &BinaryArray) -> Result<Vec<ArrayRef>, RowError> {
        let rows = values.len();
        let mut outs: Vec<Out> = self.wanted.iter().map(|c| Out::new(c.ty, rows)).collect();
        if self.wanted.is_empty() {
            return Ok(Vec::new());
        }
        let mut seen = vec![false; self.wanted.len()];
        for row in 0..rows {
            if values.is_null(row) {
                return Err(RowError::Corrupt(format!("row {row} has no value")));
            }
            let mut r = Reader {
                b: values.value(row),
                at: 0,
            };
            let head = r.take(1)?[0];
            if head != ROW_FORMAT {
                return Err(RowError::Corrupt(format!(
                    "first byte 0x{head:02x} is not the v3 row format 0x03"
                )));
            }
            seen.iter_mut().for_each(|s| *s = false);
            let mut last_id = 0u64;
            while r.at < r.b.len() {
                let id = r.varint()?;
                if id <= last_id {
                    return Err(RowError::Corrupt(format!(
                        "field id {id} after {last_id} (ids ascend)"
                    )));
                }
                last_id = id;
                let v = r.raw()?;
                let Some(&pos) = self.slot.get(id as usize).filter(|p| **p != usize::MAX) else {
                    continue; // dropped, or not wanted
                };
                let col = &self.wanted[pos];
                if matches!(v, Raw::Null) && !col.nullable {
                    return Err(RowError::Corrupt(format!(
                        "column {} (field {id}) is NULL but NOT NULL",
                        col.name
                    )));
                }
                if !outs[pos].push(v)? {
                    return Err(RowError::Corrupt(format!(
                        "column {} (field {id}) holds a {v:?} value, which does not widen to {}",
                        col.name, col.ty
                    )));
                }
                seen[pos] = true;
            }
            for (pos, s) in seen.iter().enumerate() {
                if !*s {
                    let col = &self.wanted[pos];
                    match &col.missing {
                        Some(v) => outs[pos].push_value(v, col.ty)?,
                        None if col.nullable => outs[pos].null(),
                        None => {
                            return Err(RowError::Corrupt(format!(
                                "column {} (field {}) is absent and has no missing value",
                                col.name, col.id
                            )))
                        }
                    }
                }
            }
        }
        Ok(outs
            .into_iter()
            .zip(&self.wanted)
            .map(|(o, c)| o.finish(c.ty))
            .collect())
    }
}

/// A constant as a one-row array of `t` (an INSERT's default).
pub fn value_array(v: &Value, t: ColumnType, rows: usize) -> Result<ArrayRef, RowError> {
    let mut o = Out::new(t, rows);
    for _ in 0..rows {
        o.push_value(v, t)?;
    }
    Ok(o.finish(t))
}

#[cfg(test)]
#[path = "row_tests.rs"]
mod tests;
