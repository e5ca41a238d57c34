//! SQL surfaces: how the envelope `(partition_key, event_time, sort_key, value)` appears as
//! SQL columns, and back.
//!
//! # Registered surfaces
//!
//! - [`chat`]: `channel_id BIGINT, timestamp TIMESTAMPTZ, id BIGINT, content TEXT`, integer
//!   keys in the order-preserving encoding of [`crate::model::encode_i64`].
//! - [`raw`]: the envelope as it is, bytes for keys and value.
//!
//! # Adding a surface
//!
//! A surface is one file implementing [`SurfaceKind`] (its column names and types, the
//! conversion of each key column from and to envelope bytes, the key of a filter literal and
//! a key's display form for EXPLAIN), plus its registration here: a [`Surface`] variant, its
//! name in [`Surface::parse`], and its arm in [`Surface::kind`]. The time column is the same
//! on every surface (`TIMESTAMP(µs, UTC)`) and is handled here once.

mod chat;
mod raw;

use std::sync::{Arc, OnceLock};

use datafusion::arrow::array::{
    Array, ArrayRef, TimestampMicrosecondArray, TimestampNanosecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::scalar::ScalarValue;

use super::ProviderError;
use crate::model::{EventTime, PartitionKey, Record, SortKey};

/// The time zone of every timestamp column.
pub const UTC: &str = "UTC";

/// How a table is shown in SQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Surface {
    /// `channel_id BIGINT, timestamp TIMESTAMPTZ, id BIGINT, content TEXT`.
    Chat,
    /// `partition_key BYTEA, event_time TIMESTAMPTZ, sort_key BYTEA, value BYTEA`.
    Raw,
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
    /// The value column.
    Value,
}

impl Role {
    const ALL: [Role; 4] = [Role::Partition, Role::Time, Role::Sort, Role::Value];

    /// The column's index in every surface's schema (and in the envelope).
    pub fn index(self) -> usize {
        self as usize
    }
}

/// What one surface defines; the rest of the provider reaches it only through [`Surface`].
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
    /// Parses a surface name (`chat` or `raw`).
    pub fn parse(name: &str) -> Result<Self, ProviderError> {
        [Self::Chat, Self::Raw]
            .into_iter()
            .find(|s| s.as_str() == name)
            .ok_or_else(|| ProviderError::UnknownSurface(name.to_string()))
    }

    /// The registered definition of this surface.
    pub(crate) fn kind(self) -> &'static dyn SurfaceKind {
        match self {
            Self::Chat => &chat::Chat,
            Self::Raw => &raw::Raw,
        }
    }

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        self.kind().name()
    }

    /// Column names in schema order (partition, time, sort, value).
    pub fn column_names(self) -> [&'static str; 4] {
        self.kind().column_names()
    }

    /// The role of a column by name.
    pub fn role_of(self, column: &str) -> Option<Role> {
        let names = self.column_names();
        names.iter().position(|n| *n == column).map(Self::role_at)
    }

    /// The role of the column at a schema index.
    pub fn role_at(index: usize) -> Role {
        Role::ALL[index]
    }

    /// The full SQL schema. Every column is non-null: the envelope has no nulls.
    pub fn schema(self) -> SchemaRef {
        let kind = self.kind();
        let fields: Vec<Field> = Role::ALL
            .iter()
            .map(|&role| match role {
                Role::Time => Field::new(kind.column_names()[role.index()], micros_utc(), false),
                _ => kind.key_field(role),
            })
            .collect();
        Arc::new(Schema::new(fields))
    }

    /// The partition key a filter literal names exactly, if any.
    pub(crate) fn partition_of(self, v: &ScalarValue) -> Option<PartitionKey> {
        self.kind().partition_of(v)
    }

    /// The sort key a filter literal names exactly, if any.
    pub(crate) fn sort_key_of(self, v: &ScalarValue) -> Option<SortKey> {
        self.kind().sort_key_of(v)
    }

    /// A key as a person reads it in this surface (EXPLAIN).
    pub(crate) fn display_key(self, key: &[u8]) -> String {
        self.kind().display_key(key)
    }

    /// Converts envelope batches (as the table streams them) into this surface's columns,
    /// keeping only `projection` (indices into [`Self::schema`]).
    pub fn envelope_to_surface(
        self,
        envelope: &RecordBatch,
        projection: &[usize],
        out_schema: &SchemaRef,
    ) -> Result<RecordBatch, ProviderError> {
        const ENVELOPE: [&str; 4] = ["partition_key", "event_time", "sort_key", "value"];
        let kind = self.kind();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(projection.len());
        for &i in projection {
            let role = Self::role_at(i);
            let name = ENVELOPE[role.index()];
            let col = envelope
                .column_by_name(name)
                .ok_or_else(|| ProviderError::Internal(format!("envelope batch lacks {name}")))?;
            columns.push(match role {
                Role::Time => time_to_micros(col)?,
                _ => kind.column_from_envelope(role, col)?,
            });
        }
        let opts = RecordBatchOptions::new().with_row_count(Some(envelope.num_rows()));
        Ok(RecordBatch::try_new_with_options(
            out_schema.clone(),
            columns,
            &opts,
        )?)
    }

    /// Converts a batch in this surface's full schema into records (for INSERT).
    pub fn batch_to_records(self, batch: &RecordBatch) -> Result<Vec<Record>, ProviderError> {
        let kind = self.kind();
        let names = self.column_names();
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

fn micros_of(a: &ArrayRef) -> Result<Vec<i64>, ProviderError> {
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

fn time_to_micros(a: &ArrayRef) -> Result<ArrayRef, ProviderError> {
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
            assert_eq!(names, s.column_names());
            assert_eq!(schema.field(1).data_type(), &micros_utc());
            for (i, n) in s.column_names().iter().enumerate() {
                assert_eq!(s.role_of(n), Some(Surface::role_at(i)));
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
