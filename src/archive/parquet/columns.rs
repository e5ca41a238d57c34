//! The columnar layout of a declared table's Parquet payloads (record schema v3): each
//! value column its own typed Parquet column, named as in SQL and carrying its field id
//! (`PARQUET:field_id`), so DuckDB, Spark or `datafusion-cli` read an archived payload by
//! column name.
//!
//! The rest of Pulpitum still speaks the envelope (`DELETE`, `UPDATE`, masks, erasure and
//! compaction compare a row's stored bytes), so a payload must give back every row's
//! encoded value **exactly**. The typed columns hold what SQL reads (the schema the
//! archiver wrote with: widened values, a column's missing value where the row predates
//! it); what they cannot say is kept per row in `__pulpitum_residual`, an encoded partial
//! row: the entries of fields the schema no longer has (dropped columns), the entries whose
//! stored type or bytes differ from the column's (values from before a widening), and an
//! "absent" marker for each column the row predates. For rows written under the schema the
//! archiver wrote with, the residual is empty. Rebuilding a row merges the typed columns and
//! the residual by field id, in ascending order, which is how the row was written.
//!
//! The file says which layout it has: the key-value metadata `pulpitum.value_layout =
//! columns` and a last column `__pulpitum_residual`; every typed column also names its SQL
//! type (`pulpitum.type`), since `TEXT` and `JSON` are both UTF-8 strings in Parquet.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, BinaryArray, BinaryBuilder};
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;

use crate::archive::ArchiveError;
use crate::model::envelope::{envelope_schema, COL_VALUE};
use crate::model::schema::row::{
    encode_entry, entries, natural_tag, RowDecoder, ABSENT_TAG, ROW_FORMAT,
};
use crate::model::schema::{ColumnType, TableSchema};

/// The last column of a columnar payload: each row's residual (empty for most rows).
pub const RESIDUAL: &str = "__pulpitum_residual";
/// The file metadata key naming the layout.
pub const LAYOUT_KEY: &str = "pulpitum.value_layout";
/// Its value for this layout.
pub const LAYOUT_COLUMNS: &str = "columns";
/// The file metadata key of the table schema version the payload was written with.
pub const TABLE_SCHEMA_KEY: &str = "pulpitum.table_schema_version";
/// The field metadata key of a typed column's SQL type.
pub const TYPE_KEY: &str = "pulpitum.type";
/// The field metadata key Parquet's field id travels under in Arrow.
pub const FIELD_ID_KEY: &str = "PARQUET:field_id";
/// The field metadata keys of an Arrow extension type, and the canonical JSON one's name.
const EXTENSION_NAME_KEY: &str = "ARROW:extension:name";
const EXTENSION_METADATA_KEY: &str = "ARROW:extension:metadata";
const JSON_EXTENSION: &str = "arrow.json";

/// How a declared table's values are written into a Parquet payload.
#[derive(Debug, Clone)]
pub struct ValueColumns {
    schema: TableSchema,
    payload: SchemaRef,
}

impl ValueColumns {
    /// The layout of `schema` (the table's newest when the payload is written).
    pub fn new(schema: TableSchema) -> Self {
        let env = envelope_schema(true);
        let mut fields: Vec<Field> = env.fields()[..COL_VALUE]
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        for c in &schema.columns {
            let mut meta = HashMap::from([
                (FIELD_ID_KEY.to_string(), c.id.to_string()),
                (TYPE_KEY.to_string(), c.ty.to_string()),
            ]);
            if c.ty == ColumnType::Json {
                // Arrow's canonical JSON extension, which the Parquet writer turns into the
                // JSON logical type: other engines read the column as JSON documents.
                meta.insert(EXTENSION_NAME_KEY.to_string(), JSON_EXTENSION.to_string());
                meta.insert(EXTENSION_METADATA_KEY.to_string(), String::new());
            }
            fields.push(Field::new(&c.name, c.ty.arrow(), true).with_metadata(meta));
        }
        fields.push(Field::new(
            RESIDUAL,
            datafusion::arrow::datatypes::DataType::Binary,
            false,
        ));
        let payload = Arc::new(Schema::new_with_metadata(
            fields,
            HashMap::from([
                (LAYOUT_KEY.to_string(), LAYOUT_COLUMNS.to_string()),
                (TABLE_SCHEMA_KEY.to_string(), schema.version.to_string()),
            ]),
        ));
        Self { schema, payload }
    }

    /// The table schema the payload is written with.
    pub(crate) fn schema(&self) -> &TableSchema {
        &self.schema
    }

    /// The table schema version the payload is written with.
    pub fn table_schema_version(&self) -> u32 {
        self.schema.version
    }

    /// The payload's Arrow schema.
    pub fn payload_schema(&self) -> SchemaRef {
        self.payload.clone()
    }

    /// An envelope batch (with values) in the payload's layout.
    pub fn to_payload(&self, env: &RecordBatch) -> Result<RecordBatch, ArchiveError> {
        let bad = |e: String| ArchiveError::decode("<payload encoder>", e);
        let values = env
            .column(COL_VALUE)
            .as_binary_opt::<i32>()
            .ok_or_else(|| bad("the envelope's value is not binary".into()))?;
        let all: Vec<usize> = (0..self.schema.columns.len()).collect();
        let typed = RowDecoder::new(&self.schema, &all)
            .decode(values)
            .map_err(|e| bad(e.to_string()))?;
        let mut residual = BinaryBuilder::with_capacity(env.num_rows(), 0);
        let mut scratch = Vec::new();
        let mut res = Vec::new();
        for row in 0..env.num_rows() {
            res.clear();
            let mut cols = self.schema.columns.iter().zip(&typed).peekable();
            for e in entries(values.value(row), false).map_err(|e| bad(e.to_string()))? {
                while let Some((c, _)) = cols.peek() {
                    if c.id >= e.id {
                        break;
                    }
                    absent(&mut res, c.id);
                    cols.next();
                }
                match cols.peek() {
                    Some((c, a)) if c.id == e.id => {
                        // Kept in the typed column only when rebuilding it gives the same
                        // bytes (the value's own type, canonical encoding).
                        scratch.clear();
                        if e.tag == natural_tag(c.ty) || e.tag == 0 {
                            encode_entry(&mut scratch, c.id, c.ty, a, row);
                        }
                        if scratch != e.bytes {
                            res.extend_from_slice(e.bytes);
                        }
                        cols.next();
                    }
                    _ => res.extend_from_slice(e.bytes),
                }
            }
            for (c, _) in cols {
                absent(&mut res, c.id);
            }
            if res.is_empty() {
                residual.append_value([]);
            } else {
                scratch.clear();
                scratch.push(ROW_FORMAT);
                scratch.extend_from_slice(&res);
                residual.append_value(&scratch);
            }
        }
        let mut columns: Vec<ArrayRef> = env.columns()[..COL_VALUE].to_vec();
        columns.extend(typed);
        columns.push(Arc::new(residual.finish()));
        let payload =
            RecordBatch::try_new(self.payload.clone(), columns).map_err(|e| bad(e.to_string()))?;
        // Nothing is published that does not give back every row's stored bytes: the
        // payload is rebuilt here, before it is encoded, and compared.
        let ids: Vec<(u32, ColumnType)> =
            self.schema.columns.iter().map(|c| (c.id, c.ty)).collect();
        let back = to_envelope("<payload encoder>", &ids, &payload, COL_VALUE, None)?;
        if back[COL_VALUE].as_ref() != env.column(COL_VALUE).as_ref() {
            return Err(bad(
                "the columnar layout does not give back the stored rows; not written".into(),
            ));
        }
        Ok(payload)
    }
}

fn absent(res: &mut Vec<u8>, id: u32) {
    let mut v = u64::from(id);
    while v >= 0x80 {
        res.push((v as u8) | 0x80);
        v >>= 7;
    }
    res.push(v as u8);
    res.push(ABSENT_TAG);
}

/// Whether a file schema is the columnar layout.
pub(crate) fn is_columnar(schema: &Schema) -> bool {
    schema.metadata().get(LAYOUT_KEY).map(String::as_str) == Some(LAYOUT_COLUMNS)
}

/// The typed value columns of a columnar file schema: `(field id, type)` for the columns
/// between the keys and the residual; refuses a schema that is not the layout.
pub(crate) fn value_columns(
    key: &str,
    schema: &Schema,
) -> Result<Vec<(u32, ColumnType)>, ArchiveError> {
    let bad = |why: String| {
        ArchiveError::decode(
            key,
            format!("file schema is not the columnar v3 layout: {why}"),
        )
    };
    let env = envelope_schema(true);
    let n = schema.fields().len();
    if n < COL_VALUE + 1 {
        return Err(bad(format!("{n} columns")));
    }
    for (a, b) in schema.fields()[..COL_VALUE].iter().zip(env.fields().iter()) {
        if a.name() != b.name() || a.data_type() != b.data_type() || a.is_nullable() {
            return Err(bad(format!("key column {a}")));
        }
    }
    let last = schema.field(n - 1);
    if last.name() != RESIDUAL
        || last.data_type() != &datafusion::arrow::datatypes::DataType::Binary
    {
        return Err(bad(format!("last column {last}")));
    }
    let mut out = Vec::with_capacity(n - COL_VALUE - 1);
    let mut prev = 0;
    for f in &schema.fields()[COL_VALUE..n - 1] {
        let id: u32 = f
            .metadata()
            .get(FIELD_ID_KEY)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| bad(format!("column {} has no field id", f.name())))?;
        let ty: ColumnType = f
            .metadata()
            .get(TYPE_KEY)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| bad(format!("column {} has no pulpitum.type", f.name())))?;
        if id <= prev || f.data_type() != &ty.arrow() {
            return Err(bad(format!(
                "column {} (field {id}, {ty}) is out of order or mistyped",
                f.name()
            )));
        }
        prev = id;
        out.push((id, ty));
    }
    Ok(out)
}

/// A batch read from a columnar payload as an envelope batch: the key columns as read,
/// then (when the batch holds value columns and the residual) every row's value rebuilt.
/// With `only` `None`, `columns` are all the file's typed columns and each value comes back
/// exactly as it was stored. With `only`, `columns` are the file's typed columns of those
/// fields, and each value holds just those fields (what a projection reads; never what a
/// `DELETE`, an `UPDATE` or compaction compares).
pub(crate) fn to_envelope(
    key: &str,
    columns: &[(u32, ColumnType)],
    batch: &RecordBatch,
    keys: usize,
    only: Option<&[u32]>,
) -> Result<Vec<ArrayRef>, ArchiveError> {
    let mut out: Vec<ArrayRef> = batch.columns()[..keys].to_vec();
    if batch.num_columns() == keys {
        return Ok(out);
    }
    let typed = &batch.columns()[keys..batch.num_columns() - 1];
    if typed.len() != columns.len() {
        return Err(ArchiveError::decode(
            key,
            "a columnar batch without all its value columns",
        ));
    }
    let residual = batch
        .column(batch.num_columns() - 1)
        .as_binary_opt::<i32>()
        .ok_or_else(|| ArchiveError::decode(key, "the residual is not binary"))?;
    let wanted = |id: u32| only.is_none_or(|o| o.contains(&id));
    let no_column = |id: u32| {
        ArchiveError::decode(
            key,
            format!("residual marks field {id} absent, which has no column"),
        )
    };
    let mut values = BinaryBuilder::with_capacity(batch.num_rows(), batch.num_rows() * 32);
    let mut row_bytes = Vec::new();
    for row in 0..batch.num_rows() {
        row_bytes.clear();
        row_bytes.push(ROW_FORMAT);
        let res = residual.value(row);
        let res_entries = if res.is_empty() {
            Vec::new()
        } else {
            entries(res, true).map_err(|e| ArchiveError::decode(key, format!("residual: {e}")))?
        };
        let mut r = res_entries.iter().peekable();
        for ((id, ty), a) in columns.iter().zip(typed) {
            while let Some(e) = r.peek() {
                if e.id >= *id {
                    break;
                }
                if only.is_none() {
                    row_bytes.extend_from_slice(e.bytes);
                } else if wanted(e.id) {
                    if e.tag == ABSENT_TAG {
                        return Err(no_column(e.id));
                    }
                    row_bytes.extend_from_slice(e.bytes);
                }
                r.next();
            }
            match r.peek() {
                Some(e) if e.id == *id => {
                    if e.tag != ABSENT_TAG {
                        row_bytes.extend_from_slice(e.bytes);
                    }
                    r.next();
                }
                _ => encode_entry(&mut row_bytes, *id, *ty, a, row),
            }
        }
        for e in r {
            if !wanted(e.id) {
                continue;
            }
            if e.tag == ABSENT_TAG {
                return Err(no_column(e.id));
            }
            row_bytes.extend_from_slice(e.bytes);
        }
        values.append_value(&row_bytes);
    }
    out.push(Arc::new(values.finish()));
    Ok(out)
}

/// Rebuilds a whole envelope batch (keys and value) from a columnar one.
pub(crate) fn envelope_batch(
    key: &str,
    columns: &[(u32, ColumnType)],
    batch: &RecordBatch,
) -> Result<RecordBatch, ArchiveError> {
    let cols = to_envelope(key, columns, batch, COL_VALUE, None)?;
    RecordBatch::try_new(envelope_schema(true), cols).map_err(|e| ArchiveError::decode(key, e))
}

/// The file columns a decode of a columnar payload reads for `only` (every column when
/// `None`): the keys, the typed columns of those fields, the residual. A file in the binary
/// envelope is read whole (`None`), or without its value column when `only` names no field
/// (a count, an aggregate of keys: the value is most of the bytes to decode).
pub(crate) fn projected_columns(
    key: &str,
    file_schema: &Schema,
    only: Option<&[u32]>,
) -> Result<Option<Vec<usize>>, ArchiveError> {
    let Some(only) = only else {
        return Ok(None);
    };
    if !is_columnar(file_schema) {
        return Ok(only.is_empty().then(|| (0..COL_VALUE).collect()));
    }
    let cols = value_columns(key, file_schema)?;
    let mut out: Vec<usize> = (0..COL_VALUE).collect();
    out.extend(
        cols.iter()
            .enumerate()
            .filter(|(_, (id, _))| only.contains(id))
            .map(|(i, _)| COL_VALUE + i),
    );
    out.push(COL_VALUE + cols.len());
    Ok(Some(out))
}

/// A batch decoded from a payload as the envelope: rebuilt from the columnar layout when
/// `columnar` (the manifest says record schema 3), relabelled otherwise; a file whose layout
/// is not the one its manifest says is refused. With `only`, a columnar batch holds just
/// the columns [`projected_columns`] chose, and each value just those fields.
pub(crate) fn decoded_envelope(
    key: &str,
    file_schema: &Schema,
    batch: &RecordBatch,
    columnar: bool,
    only: Option<&[u32]>,
) -> Result<RecordBatch, ArchiveError> {
    // The file's schema, not the batch's: a decoded batch need not keep the metadata.
    if is_columnar(file_schema) != columnar {
        return Err(ArchiveError::decode(
            key,
            "the file's layout is not the one its manifest's schema_version says",
        ));
    }
    if columnar {
        let cols = value_columns(key, file_schema)?;
        let Some(only) = only else {
            return envelope_batch(key, &cols, batch);
        };
        let chosen: Vec<(u32, ColumnType)> = cols
            .into_iter()
            .filter(|(id, _)| only.contains(id))
            .collect();
        let out = to_envelope(key, &chosen, batch, COL_VALUE, Some(only))?;
        return RecordBatch::try_new(envelope_schema(true), out)
            .map_err(|e| ArchiveError::decode(key, e));
    }
    // Relabel with the one envelope schema (the decoder may attach Parquet field metadata),
    // which also checks the column types.
    let mut columns = batch.columns().to_vec();
    if only.is_some_and(<[u32]>::is_empty) && columns.len() == COL_VALUE {
        // The value column was not decoded (no field of it is read): empty values keep the
        // envelope's shape, and the reader projects them away.
        let n = batch.num_rows();
        columns.push(Arc::new(BinaryArray::from_iter_values(
            std::iter::repeat_n(&b""[..], n),
        )));
    }
    RecordBatch::try_new(envelope_schema(true), columns)
        .map_err(|e| ArchiveError::decode(key, format!("not the record schema v2 envelope: {e}")))
}

/// The value column of a payload in the binary envelope: for tests.
#[cfg(test)]
fn values(b: &RecordBatch) -> &datafusion::arrow::array::BinaryArray {
    b.column(COL_VALUE).as_binary::<i32>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::envelope::COL_TIME;
    use crate::model::schema::row::RowEncoder;
    use crate::model::schema::{KeyColumn, KeyType, SchemaChange, Value};
    use crate::model::{records_to_batch, EventTime, PartitionKey, Record, SortKey};
    use datafusion::arrow::array::{BinaryArray, Int32Array, StringArray};

    #[test]
    fn rows_of_every_schema_version_come_back_byte_for_byte() {
        let v1 = TableSchema::new(
            KeyColumn {
                name: "p".into(),
                ty: KeyType::Int64,
            },
            "at".into(),
            KeyColumn {
                name: "s".into(),
                ty: KeyType::Int64,
            },
            vec![
                ("a".into(), ColumnType::Int32, true, None),
                ("b".into(), ColumnType::Text, true, None),
                ("c".into(), ColumnType::Json, true, None),
            ],
        )
        .unwrap();
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Int32Array::from(vec![Some(7), None])),
            Arc::new(StringArray::from(vec![Some("x"), Some("y")])),
            Arc::new(StringArray::from(vec![Some("[1]"), None])),
        ];
        let enc = RowEncoder::new(&v1, &cols).unwrap();
        let old = [enc.encode(0).unwrap(), enc.encode(1).unwrap()];
        // Widen a, drop b, add d with a default: rows of v1 and one of v2.
        let v2 = v1
            .apply(&SchemaChange::SetType {
                name: "a".into(),
                ty: ColumnType::Int64,
            })
            .unwrap()
            .apply(&SchemaChange::DropColumn { name: "b".into() })
            .unwrap()
            .apply(&SchemaChange::AddColumn {
                name: "d".into(),
                ty: ColumnType::Text,
                nullable: false,
                default: Some(Value::Text("z".into())),
            })
            .unwrap();
        let cols2: Vec<ArrayRef> = vec![
            Arc::new(datafusion::arrow::array::Int64Array::from(vec![Some(1)])),
            Arc::new(StringArray::from(vec![Some("{}")])),
            Arc::new(StringArray::from(vec![Some("w")])),
        ];
        let new = RowEncoder::new(&v2, &cols2).unwrap().encode(0).unwrap();
        let recs: Vec<Record> = [&old[0], &old[1], &new]
            .iter()
            .enumerate()
            .map(|(i, v)| Record {
                partition_key: PartitionKey::from_i64(1),
                event_time: EventTime::from_micros(1_000_000 + i as i64).unwrap(),
                sort_key: SortKey::from_i64(i as i64),
                value: v.to_vec(),
            })
            .collect();
        let env = records_to_batch(&recs, true);
        let layout = ValueColumns::new(v2);
        let payload = layout.to_payload(&env).unwrap();
        // What other tools read: the typed columns of v2.
        let a = payload
            .column_by_name("a")
            .unwrap()
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![Some(7), None, Some(1)]);
        let d = payload.column_by_name("d").unwrap().as_string::<i32>();
        assert_eq!(
            d.iter().collect::<Vec<_>>(),
            vec![Some("z"), Some("z"), Some("w")]
        );
        // Rows of the schema written with need no residual.
        let res = payload.column_by_name(RESIDUAL).unwrap().as_binary::<i32>();
        assert!(res.value(2).is_empty());
        assert!(!res.value(0).is_empty());
        let cols = value_columns("k", &payload.schema()).unwrap();
        let back = envelope_batch("k", &cols, &payload).unwrap();
        assert_eq!(values(&back), values(&env));
        // A decode of some fields reads only their columns (and the residual), and each
        // value holds only those fields: here `d` (added with a default, which the v1 rows
        // predate) and `a` (widened since the v1 rows).
        let ids = |names: &[&str]| -> Vec<u32> {
            names
                .iter()
                .map(|n| layout.schema.column(n).unwrap().id)
                .collect()
        };
        let only = ids(&["a", "d"]);
        let file = payload.schema();
        let picked = projected_columns("k", &file, Some(&only)).unwrap().unwrap();
        assert_eq!(picked, vec![0, 1, 2, 3, 5, 6], "keys, a, d, residual");
        let narrow = payload.project(&picked).unwrap();
        let back = decoded_envelope("k", &file, &narrow, true, Some(&only)).unwrap();
        let full = decoded_envelope("k", &file, &payload, true, None).unwrap();
        assert_eq!(values(&full), values(&env));
        for row in 0..back.num_rows() {
            let got: Vec<u32> = entries(values(&back).value(row), false)
                .unwrap()
                .iter()
                .map(|e| e.id)
                .collect();
            let want: Vec<u32> = entries(values(&env).value(row), false)
                .unwrap()
                .iter()
                .map(|e| e.id)
                .filter(|id| only.contains(id))
                .collect();
            assert_eq!(got, want, "row {row}");
        }
        let decode = |b: &RecordBatch| {
            let schema = layout.schema.clone();
            RowDecoder::new(&schema, &[0, 2]).decode(values(b)).unwrap()
        };
        assert_eq!(decode(&back), decode(&full));
        // A file in the binary envelope is read whole for any field, without its value for
        // none (and then decodes with empty values).
        assert!(projected_columns("k", &env.schema(), Some(&only))
            .unwrap()
            .is_none());
        assert_eq!(
            projected_columns("k", &env.schema(), Some(&[])).unwrap(),
            Some((0..COL_VALUE).collect::<Vec<_>>())
        );
        let keys = env.project(&[0, 1, 2]).unwrap();
        let back = decoded_envelope("k", &env.schema(), &keys, false, Some(&[])).unwrap();
        assert_eq!(back.num_columns(), COL_VALUE + 1);
        assert!(values(&back).iter().all(|v| v == Some(&b""[..])));
        assert_eq!(back.column(COL_TIME), env.column(COL_TIME));
        // A damaged residual is an error, not a row.
        let mut broken: Vec<ArrayRef> = payload.columns().to_vec();
        let n = broken.len();
        broken[n - 1] = Arc::new(BinaryArray::from(vec![&[3u8, 9][..], &[][..], &[][..]]));
        let broken = RecordBatch::try_new(payload.schema(), broken).unwrap();
        assert!(envelope_batch("k", &cols, &broken).is_err());
    }
}
