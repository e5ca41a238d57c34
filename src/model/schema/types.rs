//! The types of declared tables' columns: the SQL types of value columns
//! ([`ColumnType`], with their spellings and the widenings allowed between them), the types
//! a key column may have ([`KeyType`]) and the constants a column is filled with or reads
//! as ([`Value`], stored in the schema's JSON).

use std::fmt;
use std::str::FromStr;

use datafusion::arrow::datatypes::{DataType, TimeUnit};
use serde::{Deserialize, Serialize};

/// The SQL type of a value column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColumnType {
    /// `BOOLEAN`.
    Boolean,
    /// `SMALLINT`.
    Int16,
    /// `INTEGER`.
    Int32,
    /// `BIGINT`.
    Int64,
    /// `REAL`.
    Float32,
    /// `DOUBLE PRECISION`.
    Float64,
    /// `NUMERIC(precision, scale)`, precision 1 to 38.
    Decimal {
        /// Digits in all.
        precision: u8,
        /// Digits after the point.
        scale: i8,
    },
    /// `TEXT`.
    Text,
    /// `BYTEA`.
    Bytea,
    /// `TIMESTAMPTZ`, microseconds.
    TimestampTz,
    /// `DATE`.
    Date,
    /// `JSON`: checked on write, read as text.
    Json,
}

impl ColumnType {
    /// The Arrow type of the column in SQL.
    pub fn arrow(self) -> DataType {
        match self {
            Self::Boolean => DataType::Boolean,
            Self::Int16 => DataType::Int16,
            Self::Int32 => DataType::Int32,
            Self::Int64 => DataType::Int64,
            Self::Float32 => DataType::Float32,
            Self::Float64 => DataType::Float64,
            Self::Decimal { precision, scale } => DataType::Decimal128(precision, scale),
            Self::Text | Self::Json => DataType::Utf8,
            Self::Bytea => DataType::Binary,
            Self::TimestampTz => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            Self::Date => DataType::Date32,
        }
    }

    /// Whether a column of this type can become `to` with every stored value read exactly
    /// (a widening: `SMALLINT` to `INTEGER` to `BIGINT`, `SMALLINT` or `INTEGER` to `DOUBLE
    /// PRECISION`, `REAL` to `DOUBLE PRECISION`, a `NUMERIC` to more digits at the same
    /// scale).
    pub fn widens_to(self, to: ColumnType) -> bool {
        use ColumnType as T;
        match (self, to) {
            (a, b) if a == b => true,
            (T::Int16, T::Int32 | T::Int64 | T::Float64) => true,
            (T::Int32, T::Int64 | T::Float64) => true,
            (T::Float32, T::Float64) => true,
            (
                T::Decimal {
                    precision: p,
                    scale: s,
                },
                T::Decimal {
                    precision: q,
                    scale: t,
                },
            ) => s == t && q >= p,
            _ => false,
        }
    }
}

impl fmt::Display for ColumnType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Boolean => f.write_str("boolean"),
            Self::Int16 => f.write_str("smallint"),
            Self::Int32 => f.write_str("integer"),
            Self::Int64 => f.write_str("bigint"),
            Self::Float32 => f.write_str("real"),
            Self::Float64 => f.write_str("double precision"),
            Self::Decimal { precision, scale } => write!(f, "numeric({precision},{scale})"),
            Self::Text => f.write_str("text"),
            Self::Bytea => f.write_str("bytea"),
            Self::TimestampTz => f.write_str("timestamptz"),
            Self::Date => f.write_str("date"),
            Self::Json => f.write_str("json"),
        }
    }
}

impl FromStr for ColumnType {
    type Err = String;

    /// The stored spelling ([`fmt::Display`]) and the usual SQL spellings of each type.
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        let t = t.split_whitespace().collect::<Vec<_>>().join(" ");
        Ok(match t.as_str() {
            "boolean" | "bool" => Self::Boolean,
            "smallint" | "int2" => Self::Int16,
            "integer" | "int" | "int4" => Self::Int32,
            "bigint" | "int8" => Self::Int64,
            "real" | "float4" => Self::Float32,
            "double precision" | "double" | "float8" | "float" => Self::Float64,
            "text" | "varchar" | "character varying" | "string" => Self::Text,
            "bytea" => Self::Bytea,
            "timestamptz" | "timestamp with time zone" => Self::TimestampTz,
            "date" => Self::Date,
            "json" | "jsonb" => Self::Json,
            other => {
                let Some(args) = other
                    .strip_prefix("numeric")
                    .or_else(|| other.strip_prefix("decimal"))
                else {
                    return Err(format!("unsupported type {s:?}"));
                };
                let args = args.trim();
                let inner = args
                    .strip_prefix('(')
                    .and_then(|a| a.strip_suffix(')'))
                    .ok_or_else(|| {
                        format!("{s:?}: NUMERIC needs a precision and a scale, as NUMERIC(12, 2)")
                    })?;
                let mut parts = inner.split(',').map(str::trim);
                let p: u8 = parts
                    .next()
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(|| format!("{s:?}: bad NUMERIC precision"))?;
                let sc: i8 = match parts.next() {
                    Some(x) => x.parse().map_err(|_| format!("{s:?}: bad NUMERIC scale"))?,
                    None => 0,
                };
                if parts.next().is_some() || !(1..=38).contains(&p) || sc < 0 || sc as u8 > p {
                    return Err(format!(
                        "{s:?}: NUMERIC precision must be 1 to 38 and the scale 0 to the precision"
                    ));
                }
                Self::Decimal {
                    precision: p,
                    scale: sc,
                }
            }
        })
    }
}

impl Serialize for ColumnType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ColumnType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The type of a key column (partition or sort key): how its values become key bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyType {
    /// `SMALLINT`, `INTEGER` or `BIGINT`, stored as the order-preserving 8-byte key of
    /// [`crate::model::encode_i64`] whatever the width, so widening changes no key.
    Int16,
    /// See [`KeyType::Int16`].
    Int32,
    /// See [`KeyType::Int16`].
    Int64,
    /// `TEXT`: its UTF-8 bytes (keys order bytewise, which is `COLLATE "C"`).
    Text,
    /// `BYTEA`: the bytes.
    Bytea,
}

impl KeyType {
    /// The key type of a column type, when the type can be a key.
    pub fn of(t: ColumnType) -> Option<Self> {
        Some(match t {
            ColumnType::Int16 => Self::Int16,
            ColumnType::Int32 => Self::Int32,
            ColumnType::Int64 => Self::Int64,
            ColumnType::Text => Self::Text,
            ColumnType::Bytea => Self::Bytea,
            _ => return None,
        })
    }

    /// The column type.
    pub fn column_type(self) -> ColumnType {
        match self {
            Self::Int16 => ColumnType::Int16,
            Self::Int32 => ColumnType::Int32,
            Self::Int64 => ColumnType::Int64,
            Self::Text => ColumnType::Text,
            Self::Bytea => ColumnType::Bytea,
        }
    }

    /// Whether this is one of the integer key types.
    pub fn is_integer(self) -> bool {
        matches!(self, Self::Int16 | Self::Int32 | Self::Int64)
    }
}

/// A key column: its name and type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyColumn {
    /// The SQL name.
    pub name: String,
    /// The type.
    #[serde(rename = "type")]
    pub ty: KeyType,
}

/// A constant a column reads as or is filled with: typed like the column.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Value {
    /// SQL `NULL`.
    Null,
    /// A boolean.
    Boolean(bool),
    /// Any integer width (the column's type says which).
    Int(i64),
    /// A float (a `REAL` column's value is exactly representable); `NaN` and the
    /// infinities are stored as the strings PostgreSQL prints for them, since JSON has no
    /// number for them.
    Float(#[serde(with = "json_float")] f64),
    /// A `NUMERIC`'s unscaled digits, as a decimal string (i128 does not fit JSON numbers).
    Decimal(String),
    /// Text or JSON text.
    Text(String),
    /// Bytes, hex in the stored JSON.
    Bytes(#[serde(with = "hex_bytes")] Vec<u8>),
    /// Microseconds since the epoch, UTC.
    TimestampMicros(i64),
    /// Days since the epoch.
    Date(i32),
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        use Value as V;
        match (self, other) {
            // Bit for bit: a stored NaN default equals itself, so a repeated definition is
            // recognised as the same one.
            (V::Float(a), V::Float(b)) => a.to_bits() == b.to_bits(),
            (V::Null, V::Null) => true,
            (V::Boolean(a), V::Boolean(b)) => a == b,
            (V::Int(a), V::Int(b)) => a == b,
            (V::Decimal(a), V::Decimal(b)) | (V::Text(a), V::Text(b)) => a == b,
            (V::Bytes(a), V::Bytes(b)) => a == b,
            (V::TimestampMicros(a), V::TimestampMicros(b)) => a == b,
            (V::Date(a), V::Date(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Value {}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Null => f.write_str("NULL"),
            Self::Boolean(b) => write!(f, "{b}"),
            Self::Int(v) => write!(f, "{v}"),
            Self::Float(v) => write!(f, "{v}"),
            Self::Decimal(d) => write!(f, "{d} (unscaled)"),
            Self::Text(t) => write!(f, "'{t}'"),
            Self::Bytes(b) => write!(f, "'\\x{}'", hex::encode(b)),
            Self::TimestampMicros(t) => write!(f, "{t} µs since the epoch"),
            Self::Date(d) => write!(f, "{d} days since the epoch"),
        }
    }
}

mod json_float {
    pub fn serialize<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else if v.is_nan() {
            s.serialize_str("NaN")
        } else if *v > 0.0 {
            s.serialize_str("Infinity")
        } else {
            s.serialize_str("-Infinity")
        }
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum F {
            N(f64),
            S(String),
        }
        match F::deserialize(d)? {
            F::N(v) => Ok(v),
            F::S(s) => match s.as_str() {
                "NaN" => Ok(f64::NAN),
                "Infinity" => Ok(f64::INFINITY),
                "-Infinity" => Ok(f64::NEG_INFINITY),
                other => Err(serde::de::Error::custom(format!("not a float: {other:?}"))),
            },
        }
    }
    use serde::Deserialize;
}

mod hex_bytes {
    pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(v))
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s: String = serde::Deserialize::deserialize(d)?;
        hex::decode(s).map_err(serde::de::Error::custom)
    }
}

impl Value {
    /// Whether this constant is a value of type `t` (or `NULL`).
    pub fn fits(&self, t: ColumnType) -> bool {
        use ColumnType as T;
        match (self, t) {
            (Self::Null, _) => true,
            (Self::Boolean(_), T::Boolean) => true,
            (Self::Int(v), T::Int16) => i16::try_from(*v).is_ok(),
            (Self::Int(v), T::Int32) => i32::try_from(*v).is_ok(),
            (Self::Int(_), T::Int64) => true,
            (Self::Float(_), T::Float32 | T::Float64) => true,
            (Self::Int(v), T::Float64) => (*v as f64) as i64 == *v,
            (Self::Decimal(d), T::Decimal { precision, .. }) => d
                .parse::<i128>()
                .is_ok_and(|v| v.unsigned_abs() < 10u128.pow(u32::from(precision))),
            (Self::Text(_), T::Text) => true,
            (Self::Text(s), T::Json) => serde_json::from_str::<serde_json::Value>(s).is_ok(),
            (Self::Bytes(_), T::Bytea) => true,
            (Self::TimestampMicros(_), T::TimestampTz) => true,
            (Self::Date(_), T::Date) => true,
            _ => false,
        }
    }
}

/// The SQL type of a key column.
pub fn key_arrow(t: KeyType) -> DataType {
    t.column_type().arrow()
}
