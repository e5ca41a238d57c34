//! A declared table's surface: the three key columns the table named, then its value
//! columns, decoded from the record's value by field id ([`crate::model::schema::row`]).
//!
//! Key columns become envelope keys by type: the integer types as the order-preserving
//! 8-byte key (so an `INTEGER` key widened to `BIGINT` keeps every key), `TEXT` as its
//! UTF-8 bytes, `BYTEA` as is. Filters on keys are pushed as with `chat`; filters on value
//! columns are DataFusion's.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, Int16Array, Int32Array, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::scalar::ScalarValue;

use super::{bytes_of, int_of, micros_of, time_to_micros, Role};
use crate::model::schema::row::{value_array, RowDecoder, RowEncoder, RowError};
use crate::model::schema::{KeyType, TableSchema};
use crate::model::{decode_i64, encode_i64, EventTime, PartitionKey, Record, SortKey};
use crate::provider::ProviderError;

/// The surface name stored in a declared table's registration.
pub const NAME: &str = "declared";

/// The column of a row's stored value, in the reads of `DELETE` and `UPDATE`.
pub const STORED_VALUE: &str = "__pulpitum_value";

/// A declared table's surface at one schema version.
#[derive(Debug, PartialEq, Eq)]
pub struct Declared {
    /// The schema.
    pub schema: TableSchema,
    /// Its SQL schema (with [`STORED_VALUE`] last when `stored_value`).
    pub(super) arrow: SchemaRef,
    stored_value: bool,
}

impl From<RowError> for ProviderError {
    fn from(e: RowError) -> Self {
        match e {
            RowError::Invalid { .. } => ProviderError::InvalidInsert(e.to_string()),
            RowError::Corrupt(_) => ProviderError::CorruptRow(e.to_string()),
        }
    }
}

impl Declared {
    /// Whether the stored value is the last column (see `Surface::with_stored_value`).
    pub(crate) fn stored_value(&self) -> bool {
        self.stored_value
    }

    pub(crate) fn new(schema: TableSchema, stored_value: bool) -> Self {
        let mut arrow = schema.arrow_schema();
        if stored_value {
            let mut fields: Vec<Field> =
                arrow.fields().iter().map(|f| f.as_ref().clone()).collect();
            fields.push(Field::new(STORED_VALUE, DataType::Binary, false));
            arrow = Arc::new(Schema::new(fields));
        }
        Self {
            schema,
            arrow,
            stored_value,
        }
    }

    /// Refuses a write planned with an older schema version than the registry's newest (a
    /// change made by another session since): such a statement could put a value under a
    /// field id that now means another column. The session then re-reads the schema at once
    /// ([`crate::provider::factory::schema_went_stale`]), so running it again works.
    pub(crate) async fn check_current(
        &self,
        table: &crate::table::DurableTable,
        statement: &str,
    ) -> Result<(), ProviderError> {
        let id = &table.definition().table_id;
        let newest = table
            .store()
            .table_schema(id)
            .await
            .map_err(|e| ProviderError::Table(crate::table::TableError::Store(e)))?
            .map_or(0, |s| s.version);
        if newest == self.schema.version {
            return Ok(());
        }
        crate::provider::factory::schema_went_stale();
        Err(ProviderError::InvalidChange(format!(
            "{statement} on {id}: the table's schema changed since the statement was planned \
             (planned with version {}, the newest is {newest}); nothing was written, run the \
             statement again",
            self.schema.version
        )))
    }

    /// The `DEFAULT` of every value column that has one, as the literal an INSERT fills in.
    pub(crate) fn defaults(
        &self,
    ) -> std::collections::HashMap<String, datafusion::logical_expr::Expr> {
        self.schema
            .columns
            .iter()
            .filter_map(|c| {
                let v = c.default.as_ref()?;
                let a = value_array(v, c.ty, 1).ok()?;
                let s = ScalarValue::try_from_array(&a, 0).ok()?;
                Some((c.name.clone(), datafusion::logical_expr::lit(s)))
            })
            .collect()
    }

    /// The projected columns of an envelope batch.
    pub(super) fn columns(
        &self,
        projection: &[usize],
        envelope: &dyn Fn(Role) -> Result<ArrayRef, ProviderError>,
    ) -> Result<Vec<ArrayRef>, ProviderError> {
        let values = self.schema.columns.len();
        // Every projected value column decodes in one pass over the values.
        let wanted: Vec<usize> = projection
            .iter()
            .filter(|&&i| i >= 3 && i < 3 + values)
            .map(|&i| i - 3)
            .collect();
        let mut decoded = if wanted.is_empty() {
            Vec::new()
        } else {
            let v = envelope(Role::Value)?;
            let bin = v.as_binary_opt::<i32>().ok_or_else(|| {
                ProviderError::Internal(format!("value has type {}", v.data_type()))
            })?;
            RowDecoder::new(&self.schema, &wanted).decode(bin)?
        }
        .into_iter();
        let mut out = Vec::with_capacity(projection.len());
        for &i in projection {
            out.push(match i {
                0 => key_column(
                    self.schema.partition.ty,
                    &envelope(Role::Partition)?,
                    &self.schema.partition.name,
                )?,
                1 => time_to_micros(&envelope(Role::Time)?)?,
                2 => key_column(
                    self.schema.sort.ty,
                    &envelope(Role::Sort)?,
                    &self.schema.sort.name,
                )?,
                i if i < 3 + values => decoded.next().expect("one decoded column per wanted"),
                _ if self.stored_value => envelope(Role::Value)?,
                _ => {
                    return Err(ProviderError::Internal(format!(
                        "column index {i} out of range"
                    )))
                }
            });
        }
        Ok(out)
    }

    /// Rows of a batch in the table's schema as records: the keys by type, the value
    /// encoded from the value columns (or, in a `DELETE`'s or `UPDATE`'s read, the stored
    /// value carried in [`STORED_VALUE`]).
    pub(super) fn batch_to_records(
        &self,
        batch: &RecordBatch,
    ) -> Result<Vec<Record>, ProviderError> {
        let get = |name: &str| {
            batch
                .column_by_name(name)
                .ok_or_else(|| ProviderError::InvalidInsert(format!("missing column {name}")))
        };
        let s = &self.schema;
        let (p, t, k) = (get(&s.partition.name)?, get(&s.time)?, get(&s.sort.name)?);
        for (name, c) in [(&s.partition.name, p), (&s.time, t), (&s.sort.name, k)] {
            if c.null_count() > 0 {
                return Err(ProviderError::InvalidInsert(format!(
                    "column {name} must not be NULL (it is a key)"
                )));
            }
        }
        let times = micros_of(t)?;
        let stored = batch.column_by_name(STORED_VALUE);
        let values: Vec<ArrayRef> = match stored {
            Some(_) => Vec::new(),
            None => s
                .columns
                .iter()
                .map(|c| get(&c.name).cloned())
                .collect::<Result<_, _>>()?,
        };
        let encoder = match stored {
            Some(_) => None,
            None => Some(RowEncoder::new(s, &values)?),
        };
        let stored = stored.map(|a| {
            a.as_binary_opt::<i32>()
                .ok_or_else(|| ProviderError::Internal("stored value is not binary".into()))
        });
        let stored = stored.transpose()?;
        let mut out = Vec::with_capacity(batch.num_rows());
        for (row, &micros) in times.iter().enumerate() {
            let value = match (&encoder, stored) {
                (Some(e), _) => e.encode(row)?,
                (None, Some(v)) => v.value(row).to_vec(),
                (None, None) => unreachable!("one of the two"),
            };
            out.push(Record {
                partition_key: PartitionKey::new(key_bytes(
                    s.partition.ty,
                    p,
                    row,
                    &s.partition.name,
                )?)?,
                event_time: EventTime::from_micros(micros)?,
                sort_key: SortKey::new(key_bytes(s.sort.ty, k, row, &s.sort.name)?)?,
                value,
            });
        }
        Ok(out)
    }
}

use datafusion::arrow::record_batch::RecordBatch;

/// An envelope key column as the SQL column of `ty`.
fn key_column(ty: KeyType, a: &ArrayRef, name: &str) -> Result<ArrayRef, ProviderError> {
    let bin = a.as_binary_opt::<i32>().ok_or_else(|| {
        ProviderError::Internal(format!("{name} source has type {}", a.data_type()))
    })?;
    match ty {
        KeyType::Bytea => Ok(a.clone()),
        KeyType::Text => Ok(Arc::new(
            StringArray::try_from_binary(bin.clone()).map_err(|e| {
                ProviderError::CorruptRow(format!("{name} key is not valid UTF-8 ({e})"))
            })?,
        )),
        KeyType::Int16 | KeyType::Int32 | KeyType::Int64 => {
            let wide = super::chat::decode_i64_column(a, name)?;
            let out = wide
                .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                .values();
            let range = |lo: i64, hi: i64| {
                out.iter()
                    .find(|n| **n < lo || **n > hi)
                    .map_or(Ok(()), |n| {
                        Err(ProviderError::CorruptRow(format!(
                            "{name} key {n} does not fit {ty:?}"
                        )))
                    })
            };
            Ok(match ty {
                KeyType::Int16 => {
                    range(i16::MIN.into(), i16::MAX.into())?;
                    Arc::new(Int16Array::from_iter_values(out.iter().map(|n| *n as i16)))
                }
                KeyType::Int32 => {
                    range(i32::MIN.into(), i32::MAX.into())?;
                    Arc::new(Int32Array::from_iter_values(out.iter().map(|n| *n as i32)))
                }
                _ => wide.clone(),
            })
        }
    }
}

/// One row's key column as envelope bytes.
fn key_bytes(ty: KeyType, a: &ArrayRef, row: usize, name: &str) -> Result<Vec<u8>, ProviderError> {
    let wrong =
        || ProviderError::InvalidInsert(format!("column {name} has type {}", a.data_type()));
    Ok(match ty {
        KeyType::Int16 => encode_i64(
            a.as_primitive_opt::<datafusion::arrow::datatypes::Int16Type>()
                .ok_or_else(wrong)?
                .value(row)
                .into(),
        )
        .to_vec(),
        KeyType::Int32 => encode_i64(
            a.as_primitive_opt::<datafusion::arrow::datatypes::Int32Type>()
                .ok_or_else(wrong)?
                .value(row)
                .into(),
        )
        .to_vec(),
        KeyType::Int64 => encode_i64(
            a.as_primitive_opt::<datafusion::arrow::datatypes::Int64Type>()
                .ok_or_else(wrong)?
                .value(row),
        )
        .to_vec(),
        KeyType::Text => a
            .as_string_opt::<i32>()
            .ok_or_else(wrong)?
            .value(row)
            .as_bytes()
            .to_vec(),
        KeyType::Bytea => a
            .as_any()
            .downcast_ref::<BinaryArray>()
            .ok_or_else(wrong)?
            .value(row)
            .to_vec(),
    })
}

/// The key bytes a filter literal names exactly, for a key column of `ty`.
pub(super) fn key_of(ty: KeyType, v: &ScalarValue) -> Option<Vec<u8>> {
    match ty {
        KeyType::Int16 | KeyType::Int32 | KeyType::Int64 => Some(encode_i64(int_of(v)?).to_vec()),
        KeyType::Text => match v {
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)) => Some(s.as_bytes().to_vec()),
            _ => None,
        },
        KeyType::Bytea => bytes_of(v),
    }
}

/// A key as a person reads it (EXPLAIN).
pub(super) fn display_key(ty: KeyType, key: &[u8]) -> String {
    let hex = || format!("0x{}", hex::encode(key));
    match ty {
        KeyType::Int16 | KeyType::Int32 | KeyType::Int64 => {
            decode_i64(key).map_or_else(hex, |v| v.to_string())
        }
        KeyType::Text => std::str::from_utf8(key).map_or_else(|_| hex(), |s| format!("{s:?}")),
        KeyType::Bytea => hex(),
    }
}
