//! SQL surfaces: how the envelope `(partition_key, event_time, sort_key, value)` appears as
//! SQL columns, and back.
//!
//! # Registered surfaces
//!
//! - [`chat`]: `channel_id BIGINT, timestamp TIMESTAMPTZ, id BIGINT, content TEXT`, integer
//!   keys in the order-preserving encoding of [`crate::model::encode_i64`].
//! - [`raw`]: the envelope as it is, bytes for keys and value.
//! - [`declared`]: a table of the user's own columns (record schema v3), whose schema is
//!   the registry's newest version of it.
//!
//! # Adding a surface
//!
//! A surface is one file implementing [`SurfaceKind`] (its column names and types, the
//! conversion of each key column from and to envelope bytes, the key of a filter literal and
//! a key's display form for EXPLAIN), plus its registration here: a [`Surface`] variant, its
//! name in [`Surface::parse`], and its arm in [`Surface::kind`]. The time column is the same
//! on every surface (`TIMESTAMP(µs, UTC)`) and is handled here once.

mod chat;
pub mod declared;
mod raw;

use std::sync::{Arc, OnceLock};

use datafusion::arrow::array::{
    Array, ArrayRef, TimestampMicrosecondArray, TimestampNanosecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::scalar::ScalarValue;

use super::ProviderError;
use crate::model::schema::TableSchema;
use crate::model::{EventTime, PartitionKey, Record, SortKey};
pub use declared::Declared;

/// The time zone of every timestamp column.
pub const UTC: &str = "UTC";

/// How a table is shown in SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Surface {
    /// `channel_id BIGINT, timestamp TIMESTAMPTZ, id BIGINT, content TEXT`.
    Chat,
    /// `partition_key BYTEA, event_time TIMESTAMPTZ, sort_key BYTEA, value BYTEA`.
    Raw,
    /// A declared table's columns (record schema v3; see [`declared`]).
    Declared(Arc<Declared>),
}

/// The role of a surface column in the envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The partition key column.
    Partition,
    /// The event time column.
    Time,
    /// The sort key column.
    Sort,
    /// A value column (the only one of `chat` and `raw`, any of a declared table's).
    Value,
}

impl Role {
    const ALL: [Role; 4] = [Role::Partition, Role::Time, Role::Sort, Role::Value];

    /// The column's index in the envelope (and of the keys in every surface's schema).
    pub fn index(self) -> usize {
        self as usize
    }
}

/// What one fixed surface defines; the rest of the provider reaches it only through
/// [`Surface`].
pub(crate) trait SurfaceKind: Sync {
    /// The name stored in a table's registration.
    fn name(&self) -> &'static str;
    /// Column names in schema order (partition, time, sort, value).
    fn column_names(&self) -> [&'static str; 4];
    /// The SQL field of a partition, sort or value column (all non-null).
    fn key_field(&self, role: Role) -> Field;
    /// A partition, sort or value column of the envelope as this surface's column.
    fn column_from_envelope(
        &self,
        role: Role,
        column: &ArrayRef,
    ) -> Result<ArrayRef, ProviderError>;
    /// One row's partition, sort or value column of this surface as envelope bytes.
    fn envelope_bytes(
        &self,
        role: Role,
        column: &ArrayRef,
        row: usize,
    ) -> Result<Vec<u8>, ProviderError>;
    /// The partition key a filter literal names, when it names one exactly.
    fn partition_of(&self, v: &ScalarValue) -> Option<PartitionKey>;
    /// The sort key a filter literal names, when it names one exactly.
    fn sort_key_of(&self, v: &ScalarValue) -> Option<SortKey>;
    /// A key as a person reads it in this surface (EXPLAIN).
    fn display_key(&self, key: &[u8]) -> String;
}

impl Surface {
    /// Parses a fixed surface's name (`chat` or `raw`).
    pub fn parse(name: &str) -> Result<Self, ProviderError> {
        [Self::Chat, Self::Raw]
            .into_iter()
            .find(|s| s.as_str() == name)
            .ok_or_else(|| ProviderError::UnknownSurface(name.to_string()))
    }

    /// The surface of a declared table's schema.
    pub fn declared(schema: TableSchema) -> Self {
        Self::Declared(Arc::new(Declared::new(schema, false)))
    }

    /// This surface with a trailing `__pulpitum_value` column holding each row's stored
    /// value as it is: what `DELETE` and `UPDATE` of a declared table read, since a row
    /// re-encoded from its columns need not be the bytes it was stored as (written under
    /// an older schema version). Other surfaces are returned unchanged.
    pub(crate) fn with_stored_value(&self) -> Self {
        match self {
            Self::Declared(d) => Self::Declared(Arc::new(Declared::new(d.schema.clone(), true))),
            other => other.clone(),
        }
    }

    /// The value fields a scan projecting these columns reads: `None` (every field, each
    /// row's stored bytes exactly) unless this is a declared table read without its stored
    /// value, whose projected value columns are then all a read needs.
    pub(crate) fn value_fields(&self, projection: &[usize]) -> Option<Arc<[u32]>> {
        let Self::Declared(d) = self else {
            return None;
        };
        let n = d.schema.columns.len();
        if projection.iter().any(|&i| i >= 3 + n) {
            return None;
        }
        Some(
            projection
                .iter()
                .filter(|&&i| i >= 3)
                .map(|&i| d.schema.columns[i - 3].id)
                .collect(),
        )
    }

    /// The registered definition of a fixed surface.
    pub(crate) fn kind(&self) -> Option<&'static dyn SurfaceKind> {
        match self {
            Self::Chat => Some(&chat::Chat),
            Self::Raw => Some(&raw::Raw),
            Self::Declared(_) => None,
        }
    }

    /// The stored name (`chat`, `raw`, `declared`).
    pub fn as_str(&self) -> &'static str {
        match self.kind() {
            Some(k) => k.name(),
            None => declared::NAME,
        }
    }

    /// The names of the partition, time and sort columns.
    pub fn key_names(&self) -> [&str; 3] {
        match self {
            Self::Declared(d) => [
                d.schema.partition.name.as_str(),
                d.schema.time.as_str(),
                d.schema.sort.name.as_str(),
            ],
            other => {
                let [p, t, s, _] = other.kind().expect("a fixed surface").column_names();
                [p, t, s]
            }
        }
    }

    /// The role of a column by name.
    pub fn role_of(&self, column: &str) -> Option<Role> {
        let index = match self {
            Self::Declared(d) => d.arrow.index_of(column).ok()?,
            other => {
                let names = other.kind().expect("a fixed surface").column_names();
                names.iter().position(|n| *n == column)?
            }
        };
        Some(self.role_at(index))
    }

    /// The role of the column at a schema index.
    pub fn role_at(&self, index: usize) -> Role {
        Role::ALL[index.min(Role::Value.index())]
    }

    /// The full SQL schema. The keys are non-null; the value columns of `chat` and `raw`
    /// too (the envelope has no nulls), a declared table's as declared.
    pub fn schema(&self) -> SchemaRef {
        let kind = match self {
            Self::Declared(d) => return d.arrow.clone(),
            other => other.kind().expect("a fixed surface"),
        };
        let fields: Vec<Field> = Role::ALL
            .iter()
            .map(|&role| match role {
                Role::Time => Field::new(kind.column_names()[role.index()], micros_utc(), false),
                _ => kind.key_field(role),
            })
            .collect();
        Arc::new(Schema::new(fields))
    }

    /// [`Surface::schema`] with every column nullable: what rows on their way in (an
    /// `INSERT`'s, an `UPDATE`'s assignments) are held in, so that a NULL in a NOT NULL
    /// column reaches [`Surface::batch_to_records`], which names the column, instead of
    /// failing in Arrow by position.
    pub fn incoming_schema(&self) -> SchemaRef {
        let full = self.schema();
        let fields: Vec<_> = full
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        Arc::new(datafusion::arrow::datatypes::Schema::new_with_metadata(
            fields,
            full.metadata().clone(),
        ))
    }

    /// The partition key a filter literal names exactly, if any.
    pub(crate) fn partition_of(&self, v: &ScalarValue) -> Option<PartitionKey> {
        match self {
            Self::Declared(d) => {
                declared::key_of(d.schema.partition.ty, v).and_then(|k| PartitionKey::new(k).ok())
            }
            other => other.kind()?.partition_of(v),
        }
    }

    /// The sort key a filter literal names exactly, if any.
    pub(crate) fn sort_key_of(&self, v: &ScalarValue) -> Option<SortKey> {
        match self {
            Self::Declared(d) => {
                declared::key_of(d.schema.sort.ty, v).and_then(|k| SortKey::new(k).ok())
            }
            other => other.kind()?.sort_key_of(v),
        }
    }

    /// A key as a person reads it in this surface (EXPLAIN); `role` is the partition or
    /// sort key.
    pub(crate) fn display_key(&self, role: Role, key: &[u8]) -> String {
        match self {
            Self::Declared(d) => {
                let ty = if role == Role::Partition {
                    d.schema.partition.ty
                } else {
                    d.schema.sort.ty
                };
                declared::display_key(ty, key)
            }
            other => other.kind().expect("a fixed surface").display_key(key),
        }
    }

    /// Converts envelope batches (as the table streams them) into this surface's columns,
    /// keeping only `projection` (indices into [`Self::schema`]).
    pub fn envelope_to_surface(
        &self,
        envelope: &RecordBatch,
        projection: &[usize],
        out_schema: &SchemaRef,
    ) -> Result<RecordBatch, ProviderError> {
        const ENVELOPE: [&str; 4] = ["partition_key", "event_time", "sort_key", "value"];
        let envelope_column = |role: Role| {
            let name = ENVELOPE[role.index()];
            envelope
                .column_by_name(name)
                .cloned()
                .ok_or_else(|| ProviderError::Internal(format!("envelope batch lacks {name}")))
        };
        let columns: Vec<ArrayRef> = match self {
            Self::Declared(d) => d.columns(projection, &envelope_column)?,
            other => {
                let kind = other.kind().expect("a fixed surface");
                let mut columns = Vec::with_capacity(projection.len());
                for &i in projection {
                    let role = self.role_at(i);
                    let col = envelope_column(role)?;
                    columns.push(match role {
                        Role::Time => time_to_micros(&col)?,
                        _ => kind.column_from_envelope(role, &col)?,
                    });
                }
                columns
            }
        };
        let opts = RecordBatchOptions::new().with_row_count(Some(envelope.num_rows()));
        Ok(RecordBatch::try_new_with_options(
            out_schema.clone(),
            columns,
            &opts,
        )?)
    }

    /// Converts a batch in this surface's full schema into records (for INSERT, and for the
    /// rows a DELETE or UPDATE read).
    pub fn batch_to_records(&self, batch: &RecordBatch) -> Result<Vec<Record>, ProviderError> {
        if let Self::Declared(d) = self {
            return d.batch_to_records(batch);
        }
        let kind = self.kind().expect("a fixed surface");
        let names = kind.column_names();
        let get = |i: usize| {
            batch
                .column_by_name(names[i])
                .ok_or_else(|| ProviderError::InvalidInsert(format!("missing column {}", names[i])))
        };
        let (p, t, s, v) = (get(0)?, get(1)?, get(2)?, get(3)?);
        for (i, c) in [p, t, s, v].iter().enumerate() {
            if c.null_count() > 0 {
                return Err(ProviderError::InvalidInsert(format!(
                    "column {} must not be NULL",
                    names[i]
                )));
            }
        }
        let times = micros_of(t)?;
        let mut out = Vec::with_capacity(batch.num_rows());
        for (row, &micros) in times.iter().enumerate() {
            out.push(Record {
                partition_key: PartitionKey::new(kind.envelope_bytes(Role::Partition, p, row)?)?,
                event_time: EventTime::from_micros(micros)?,
                sort_key: SortKey::new(kind.envelope_bytes(Role::Sort, s, row)?)?,
                value: kind.envelope_bytes(Role::Value, v, row)?,
            });
        }
        Ok(out)
    }
}

fn downcast<'a, T: 'static>(a: &'a ArrayRef, name: &str) -> Result<&'a T, ProviderError> {
    a.as_any().downcast_ref::<T>().ok_or_else(|| {
        ProviderError::InvalidInsert(format!("column {name} has type {}", a.data_type()))
    })
}

/// An integer literal as `i64`, whatever its width; `None` when it is not one or does not fit.
fn int_of(v: &ScalarValue) -> Option<i64> {
    match v {
        ScalarValue::Int64(Some(x)) => Some(*x),
        ScalarValue::Int32(Some(x)) => Some(i64::from(*x)),
        ScalarValue::Int16(Some(x)) => Some(i64::from(*x)),
        ScalarValue::Int8(Some(x)) => Some(i64::from(*x)),
        ScalarValue::UInt32(Some(x)) => Some(i64::from(*x)),
        ScalarValue::UInt16(Some(x)) => Some(i64::from(*x)),
        ScalarValue::UInt8(Some(x)) => Some(i64::from(*x)),
        ScalarValue::UInt64(Some(x)) => i64::try_from(*x).ok(),
        _ => None,
    }
}

/// A binary literal's bytes.
fn bytes_of(v: &ScalarValue) -> Option<Vec<u8>> {
    match v {
        ScalarValue::Binary(Some(b))
        | ScalarValue::LargeBinary(Some(b))
        | ScalarValue::BinaryView(Some(b)) => Some(b.clone()),
        ScalarValue::FixedSizeBinary(_, Some(b)) => Some(b.clone()),
        _ => None,
    }
}

pub(super) fn micros_of(a: &ArrayRef) -> Result<Vec<i64>, ProviderError> {
    match a.data_type() {
        DataType::Timestamp(TimeUnit::Microsecond, _) => Ok(a
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .expect("checked type")
            .values()
            .to_vec()),
        other => Err(ProviderError::InvalidInsert(format!(
            "timestamp column has type {other}, expected Timestamp(µs, UTC)"
        ))),
    }
}

pub(super) fn time_to_micros(a: &ArrayRef) -> Result<ArrayRef, ProviderError> {
    let ns = a
        .as_any()
        .downcast_ref::<TimestampNanosecondArray>()
        .ok_or_else(|| ProviderError::Internal(format!("event_time has type {}", a.data_type())))?;
    let us: TimestampMicrosecondArray = ns.unary(|v| v.div_euclid(1_000));
    Ok(Arc::new(us.with_data_type(micros_utc())))
}

/// `Timestamp(µs, "UTC")`, its time zone string allocated once (every hot page converts
/// its times into this type).
fn micros_utc() -> DataType {
    static TYPE: OnceLock<DataType> = OnceLock::new();
    TYPE.get_or_init(|| DataType::Timestamp(TimeUnit::Microsecond, Some(UTC.into())))
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_surface_parses_back_and_names_its_columns() {
        for s in [Surface::Chat, Surface::Raw] {
            assert_eq!(Surface::parse(s.as_str()).unwrap(), s);
            let schema = s.schema();
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            let want = s.kind().unwrap().column_names();
            assert_eq!(names, want);
            assert_eq!(schema.field(1).data_type(), &micros_utc());
            for (i, n) in want.iter().enumerate() {
                assert_eq!(s.role_of(n), Some(s.role_at(i)));
            }
        }
        assert!(matches!(
            Surface::parse("chats"),
            Err(ProviderError::UnknownSurface(ref n)) if n == "chats"
        ));
    }
}

/// A column type as PostgreSQL names it (`bigint`, `timestamp with time zone`, `text`), the
/// form psql's `\d` shows through the wire server, for the shell's `\d NAME`; a type with
/// no PostgreSQL counterpart keeps Arrow's name.
pub fn sql_type_name(t: &datafusion::arrow::datatypes::DataType) -> String {
    use datafusion::arrow::datatypes::DataType as D;
    match t {
        D::Boolean => "boolean".into(),
        D::Int8 | D::Int16 | D::UInt8 => "smallint".into(),
        D::Int32 | D::UInt16 => "integer".into(),
        D::Int64 | D::UInt32 => "bigint".into(),
        D::UInt64 => "numeric".into(),
        D::Float16 | D::Float32 => "real".into(),
        D::Float64 => "double precision".into(),
        D::Utf8 | D::LargeUtf8 | D::Utf8View => "text".into(),
        D::Binary | D::LargeBinary | D::BinaryView | D::FixedSizeBinary(_) => "bytea".into(),
        D::Timestamp(_, Some(_)) => "timestamp with time zone".into(),
        D::Timestamp(_, None) => "timestamp without time zone".into(),
        D::Date32 | D::Date64 => "date".into(),
        D::Time32(_) | D::Time64(_) => "time without time zone".into(),
        D::Interval(_) | D::Duration(_) => "interval".into(),
        D::Decimal128(p, s) | D::Decimal256(p, s) => format!("numeric({p},{s})"),
        D::List(f) | D::LargeList(f) | D::FixedSizeList(f, _) => {
            format!("{}[]", sql_type_name(f.data_type()))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod sql_type_tests {
    use super::sql_type_name;
    use datafusion::arrow::datatypes::{DataType, TimeUnit};

    #[test]
    fn the_chat_columns_read_as_postgresql_types() {
        assert_eq!(sql_type_name(&DataType::Int64), "bigint");
        assert_eq!(
            sql_type_name(&DataType::Timestamp(
                TimeUnit::Microsecond,
                Some("UTC".into())
            )),
            "timestamp with time zone"
        );
        assert_eq!(sql_type_name(&DataType::Utf8), "text");
        assert_eq!(sql_type_name(&DataType::Binary), "bytea");
        assert_eq!(sql_type_name(&DataType::Boolean), "boolean");
    }
}
