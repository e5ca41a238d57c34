//! Declared table schemas: the columns a user gave a table, their types and field ids, and
//! the rules by which a schema may change.
//!
//! A declared table maps three of its columns to the envelope's keys (partition key, event
//! time, sort key) and keeps every other column in the record's value, encoded by
//! [`row`] (record schema v3). Each value column has a **field id**, given once and never
//! reused: the encoded row names its fields by id, so a rename never mixes columns, a
//! dropped column's bytes are ignored, and a column added later reads as the value it was
//! added with (PostgreSQL's "missing value": `NULL`, or the `DEFAULT` given in `ADD
//! COLUMN`). A schema change is a new [`TableSchema`] with the next version, checked by
//! [`TableSchema::apply`] and stored beside the older versions; no row is rewritten.
//!
//! Pure values and validation: the registry persists a schema as the JSON of
//! [`TableSchema::to_json`], and [`TableSchema::from_json`] refuses an unknown format.

pub mod predicate;
pub mod row;
mod types;

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use serde::{Deserialize, Serialize};

pub use types::{key_arrow, ColumnType, KeyColumn, KeyType, Value};

/// The format of a schema's JSON; a reader refuses any other.
pub const SCHEMA_FORMAT: u32 = 1;

/// The most value columns a table may have: field ids are a row's varints, and a reader's
/// lookup is an array indexed by id.
pub const MAX_COLUMNS: usize = 1600;

/// The record schema version of declared tables (the value is a [`row`]-encoded row).
pub const DECLARED_RECORD_SCHEMA_VERSION: u32 = 3;

/// Every way a schema or a change to it can be refused. Each names what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// A type the table cannot store, or cannot store in this place.
    #[error("column {column}: {reason}")]
    Type {
        /// The column.
        column: String,
        /// Why.
        reason: String,
    },
    /// A column name used twice, or a name a change needs that is absent.
    #[error("column {column}: {reason}")]
    Column {
        /// The column.
        column: String,
        /// Why.
        reason: String,
    },
    /// A change that older rows or archives could not follow.
    #[error("cannot {change}: {reason}")]
    Refused {
        /// The change, as written.
        change: String,
        /// Why it cannot be made without a rewrite, and what to do instead.
        reason: String,
    },
    /// A stored schema this build cannot read.
    #[error("stored table schema: {0}")]
    Stored(String),
}

/// A value column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnDef {
    /// The field id: given at creation or `ADD COLUMN`, never reused.
    pub id: u32,
    /// The SQL name.
    pub name: String,
    /// The type.
    #[serde(rename = "type")]
    pub ty: ColumnType,
    /// Whether `NULL` is allowed.
    pub nullable: bool,
    /// What a row written before the column existed reads as (fixed when it is added).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing: Option<Value>,
    /// What an `INSERT` that names no value for the column stores (`SET DEFAULT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
}

/// One version of a declared table's schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableSchema {
    /// [`SCHEMA_FORMAT`].
    pub format: u32,
    /// The table schema version: 1 at creation, +1 per change.
    pub version: u32,
    /// The partition key column.
    pub partition: KeyColumn,
    /// The event time column's name (`TIMESTAMPTZ NOT NULL`).
    pub time: String,
    /// The sort key column.
    pub sort: KeyColumn,
    /// The value columns, in SQL order.
    pub columns: Vec<ColumnDef>,
    /// The next field id to give.
    pub next_field_id: u32,
}

/// A schema change, as `ALTER TABLE` writes it.
#[derive(Debug, Clone, PartialEq)]
pub enum SchemaChange {
    /// `ADD COLUMN name type [NOT NULL] [DEFAULT constant]`.
    AddColumn {
        /// The name.
        name: String,
        /// The type.
        ty: ColumnType,
        /// Whether `NULL` is allowed.
        nullable: bool,
        /// The default (also what existing rows read as).
        default: Option<Value>,
    },
    /// `DROP COLUMN name`.
    DropColumn {
        /// The column.
        name: String,
    },
    /// `RENAME COLUMN old TO new`.
    RenameColumn {
        /// The column.
        from: String,
        /// Its new name.
        to: String,
    },
    /// `ALTER COLUMN name TYPE type` (widening only).
    SetType {
        /// The column.
        name: String,
        /// The new type.
        ty: ColumnType,
    },
    /// `ALTER COLUMN name DROP NOT NULL`.
    DropNotNull {
        /// The column.
        name: String,
    },
    /// `ALTER COLUMN name SET DEFAULT constant` (`None`: `DROP DEFAULT`).
    SetDefault {
        /// The column.
        name: String,
        /// The new default.
        default: Option<Value>,
    },
}

impl fmt::Display for SchemaChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AddColumn { name, ty, .. } => write!(f, "add column {name} {ty}"),
            Self::DropColumn { name } => write!(f, "drop column {name}"),
            Self::RenameColumn { from, to } => write!(f, "rename column {from} to {to}"),
            Self::SetType { name, ty } => write!(f, "change column {name} to {ty}"),
            Self::DropNotNull { name } => write!(f, "drop NOT NULL of column {name}"),
            Self::SetDefault { name, .. } => write!(f, "change the default of column {name}"),
        }
    }
}

fn check_name(name: &str) -> Result<(), SchemaError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && !name.starts_with("__pulpitum")
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(SchemaError::Column {
            column: name.to_string(),
            reason: "a column name is 1 to 63 characters of [a-z0-9_], not starting with a \
                     digit or __pulpitum (quote nothing; names are folded to lower case)"
                .into(),
        })
    }
}

impl TableSchema {
    /// The first version of a table's schema, checked: distinct valid names, keys of key
    /// types, at most [`MAX_COLUMNS`] value columns, defaults that fit their columns.
    pub fn new(
        partition: KeyColumn,
        time: String,
        sort: KeyColumn,
        columns: Vec<(String, ColumnType, bool, Option<Value>)>,
    ) -> Result<Self, SchemaError> {
        let mut s = Self {
            format: SCHEMA_FORMAT,
            version: 1,
            partition,
            time,
            sort,
            columns: Vec::new(),
            next_field_id: 1,
        };
        for (name, ty, nullable, default) in columns {
            let id = s.next_field_id;
            s.next_field_id += 1;
            s.columns.push(ColumnDef {
                id,
                name,
                ty,
                nullable,
                missing: None,
                default,
            });
        }
        s.validate()?;
        Ok(s)
    }

    /// Checks every rule a stored or new schema keeps.
    pub fn validate(&self) -> Result<(), SchemaError> {
        if self.format != SCHEMA_FORMAT {
            return Err(SchemaError::Stored(format!(
                "format {} is not {SCHEMA_FORMAT}; this build cannot read it (upgrade Pulpitum)",
                self.format
            )));
        }
        let mut names = BTreeSet::new();
        let mut ids = BTreeSet::new();
        for c in &self.columns {
            // A columnar payload names its key columns so, and its last column the residual.
            if ["partition_key", "event_time", "sort_key", "value"].contains(&c.name.as_str()) {
                return Err(SchemaError::Column {
                    column: c.name.clone(),
                    reason: "is the name of an archive column (partition_key, event_time, \
                             sort_key and value are reserved for value columns)"
                        .into(),
                });
            }
        }
        for name in self.column_names() {
            check_name(name)?;
            if !names.insert(name) {
                return Err(SchemaError::Column {
                    column: name.to_string(),
                    reason: "is named twice".into(),
                });
            }
        }
        if self.columns.len() > MAX_COLUMNS {
            return Err(SchemaError::Column {
                column: self.columns[MAX_COLUMNS].name.clone(),
                reason: format!("a table has at most {MAX_COLUMNS} value columns"),
            });
        }
        for c in &self.columns {
            if c.id == 0 || c.id >= self.next_field_id || !ids.insert(c.id) {
                return Err(SchemaError::Stored(format!(
                    "column {} has field id {} (ids are distinct, from 1 to below {})",
                    c.name, c.id, self.next_field_id
                )));
            }
            for (what, v) in [("DEFAULT", &c.default), ("missing value", &c.missing)] {
                if let Some(v) = v {
                    if !v.fits(c.ty) {
                        return Err(SchemaError::Type {
                            column: c.name.clone(),
                            reason: format!("{what} {v} is not a {} value", c.ty),
                        });
                    }
                    if !c.nullable && *v == Value::Null {
                        return Err(SchemaError::Type {
                            column: c.name.clone(),
                            reason: format!("{what} is NULL but the column is NOT NULL"),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Every column name in SQL order: partition, time, sort, then the value columns.
    pub fn column_names(&self) -> impl Iterator<Item = &str> {
        [
            self.partition.name.as_str(),
            self.time.as_str(),
            self.sort.name.as_str(),
        ]
        .into_iter()
        .chain(self.columns.iter().map(|c| c.name.as_str()))
    }

    /// The value column named `name`.
    pub fn column(&self, name: &str) -> Option<&ColumnDef> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The SQL schema: the three keys (non-null), then the value columns; every field
    /// carries its field id as `PARQUET:field_id` metadata (the keys have none).
    pub fn arrow_schema(&self) -> SchemaRef {
        let mut fields = vec![
            Field::new(&self.partition.name, key_arrow(self.partition.ty), false),
            Field::new(
                &self.time,
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                false,
            ),
            Field::new(&self.sort.name, key_arrow(self.sort.ty), false),
        ];
        for c in &self.columns {
            fields.push(
                Field::new(&c.name, c.ty.arrow(), c.nullable)
                    .with_metadata([("PARQUET:field_id".to_string(), c.id.to_string())].into()),
            );
        }
        Arc::new(Schema::new(fields))
    }

    /// The schema after `change`, as the next version; refused with the reason when older
    /// rows could not be read as the new schema says, or the names do not fit.
    pub fn apply(&self, change: &SchemaChange) -> Result<TableSchema, SchemaError> {
        let refused = |reason: &str| SchemaError::Refused {
            change: change.to_string(),
            reason: reason.to_string(),
        };
        let mut next = self.clone();
        next.version += 1;
        let find = |next: &mut TableSchema, name: &str| -> Result<usize, SchemaError> {
            if self.is_key(name) {
                return Err(refused(
                    "it is a key column (partition key, time or sort key), which is part of \
                     every row's identity and bucket; create a new table instead",
                ));
            }
            next.columns
                .iter()
                .position(|c| c.name == name)
                .ok_or_else(|| SchemaError::Column {
                    column: name.to_string(),
                    reason: "no such column".into(),
                })
        };
        match change {
            SchemaChange::AddColumn {
                name,
                ty,
                nullable,
                default,
            } => {
                if !nullable && default.as_ref().is_none_or(|d| *d == Value::Null) {
                    return Err(refused(
                        "rows written before it have no value; give it a DEFAULT (what older \
                         rows read as) or let it be NULL",
                    ));
                }
                let id = next.next_field_id;
                next.next_field_id += 1;
                next.columns.push(ColumnDef {
                    id,
                    name: name.clone(),
                    ty: *ty,
                    nullable: *nullable,
                    missing: default.clone().filter(|d| *d != Value::Null),
                    default: default.clone().filter(|d| *d != Value::Null),
                });
            }
            SchemaChange::DropColumn { name } => {
                let i = find(&mut next, name)?;
                next.columns.remove(i);
            }
            SchemaChange::RenameColumn { from, to } => {
                if self.column_names().any(|n| n == to) {
                    return Err(refused(&format!("a column is already named {to}")));
                }
                if self.partition.name == *from {
                    next.partition.name = to.clone();
                } else if self.time == *from {
                    next.time = to.clone();
                } else if self.sort.name == *from {
                    next.sort.name = to.clone();
                } else {
                    let i = find(&mut next, from)?;
                    next.columns[i].name = to.clone();
                }
            }
            SchemaChange::SetType { name, ty } => {
                let i = find(&mut next, name)?;
                let from = next.columns[i].ty;
                if !from.widens_to(*ty) {
                    return Err(refused(&format!(
                        "{from} does not widen to {ty}: stored values might not fit or read \
                         back exactly (the widenings are smallint to integer to bigint, \
                         smallint or integer to double precision, real to double precision, \
                         numeric to more digits at the same scale); add a new column and \
                         fill it instead"
                    )));
                }
                next.columns[i].ty = *ty;
                // An integer constant of a column widened to DOUBLE PRECISION becomes that
                // double (exact: `fits` checks it).
                let c = &mut next.columns[i];
                if *ty == ColumnType::Float64 {
                    for v in [&mut c.missing, &mut c.default].into_iter().flatten() {
                        if let Value::Int(n) = v {
                            *v = Value::Float(*n as f64);
                        }
                    }
                }
            }
            SchemaChange::DropNotNull { name } => {
                let i = find(&mut next, name)?;
                next.columns[i].nullable = true;
            }
            SchemaChange::SetDefault { name, default } => {
                let i = find(&mut next, name)?;
                next.columns[i].default = default.clone().filter(|d| *d != Value::Null);
            }
        }
        next.validate()?;
        Ok(next)
    }

    /// Whether `name` is one of the three key columns.
    pub fn is_key(&self, name: &str) -> bool {
        name == self.partition.name || name == self.time || name == self.sort.name
    }

    /// The stored form.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a schema serializes")
    }

    /// The stored form, checked to read back as this very schema: nothing is stored that a
    /// reader could not load (a registry row no session can read would hide its table).
    pub fn to_checked_json(&self) -> Result<String, SchemaError> {
        let json = self.to_json();
        match Self::from_json(&json) {
            Ok(back) if back == *self => Ok(json),
            Ok(_) => Err(SchemaError::Stored(
                "the schema would not read back as written; not stored".into(),
            )),
            Err(e) => Err(SchemaError::Stored(format!(
                "the schema would not read back ({e}); not stored"
            ))),
        }
    }

    /// Reads a stored schema, refusing an unknown format and a schema that breaks a rule.
    pub fn from_json(json: &str) -> Result<Self, SchemaError> {
        #[derive(Deserialize)]
        struct Probe {
            format: u32,
        }
        let probe: Probe = serde_json::from_str(json)
            .map_err(|e| SchemaError::Stored(format!("not a table schema ({e})")))?;
        if probe.format != SCHEMA_FORMAT {
            return Err(SchemaError::Stored(format!(
                "format {} is not {SCHEMA_FORMAT}; this build cannot read it (upgrade Pulpitum)",
                probe.format
            )));
        }
        let s: Self = serde_json::from_str(json)
            .map_err(|e| SchemaError::Stored(format!("not a table schema ({e})")))?;
        s.validate()?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events() -> TableSchema {
        TableSchema::new(
            KeyColumn {
                name: "tenant_id".into(),
                ty: KeyType::Int64,
            },
            "at".into(),
            KeyColumn {
                name: "seq".into(),
                ty: KeyType::Int64,
            },
            vec![
                ("kind".into(), ColumnType::Text, false, None),
                ("amount".into(), ColumnType::Float64, true, None),
            ],
        )
        .unwrap()
    }

    #[test]
    fn types_parse_in_their_sql_spellings_and_print_back() {
        for (s, t) in [
            ("BIGINT", ColumnType::Int64),
            ("int", ColumnType::Int32),
            ("Double  Precision", ColumnType::Float64),
            ("TIMESTAMP WITH TIME ZONE", ColumnType::TimestampTz),
            ("jsonb", ColumnType::Json),
            (
                "NUMERIC(12, 2)",
                ColumnType::Decimal {
                    precision: 12,
                    scale: 2,
                },
            ),
        ] {
            let parsed: ColumnType = s.parse().unwrap();
            assert_eq!(parsed, t, "{s}");
            assert_eq!(parsed.to_string().parse::<ColumnType>().unwrap(), t);
        }
        assert!("numeric".parse::<ColumnType>().is_err());
        assert!("numeric(40,2)".parse::<ColumnType>().is_err());
        assert!("interval".parse::<ColumnType>().is_err());
    }

    #[test]
    fn changes_keep_field_ids_and_refuse_what_older_rows_cannot_follow() {
        let v1 = events();
        let v2 = v1
            .apply(&SchemaChange::RenameColumn {
                from: "amount".into(),
                to: "total".into(),
            })
            .unwrap();
        assert_eq!(v2.version, 2);
        assert_eq!(
            v2.column("total").unwrap().id,
            v1.column("amount").unwrap().id
        );
        let v3 = v2
            .apply(&SchemaChange::DropColumn {
                name: "total".into(),
            })
            .unwrap();
        let v4 = v3
            .apply(&SchemaChange::AddColumn {
                name: "total".into(),
                ty: ColumnType::Int32,
                nullable: false,
                default: Some(Value::Int(0)),
            })
            .unwrap();
        // A column added under a dropped column's name never gets the dropped one's id.
        assert_eq!(v4.column("total").unwrap().id, 3);
        assert_eq!(v4.column("total").unwrap().missing, Some(Value::Int(0)));
        let v5 = v4
            .apply(&SchemaChange::SetType {
                name: "total".into(),
                ty: ColumnType::Int64,
            })
            .unwrap();
        assert_eq!(v5.column("total").unwrap().ty, ColumnType::Int64);
        for bad in [
            SchemaChange::SetType {
                name: "total".into(),
                ty: ColumnType::Int16,
            },
            SchemaChange::AddColumn {
                name: "x".into(),
                ty: ColumnType::Text,
                nullable: false,
                default: None,
            },
            SchemaChange::DropColumn { name: "seq".into() },
            SchemaChange::SetType {
                name: "kind".into(),
                ty: ColumnType::Bytea,
            },
        ] {
            assert!(
                matches!(v5.apply(&bad), Err(SchemaError::Refused { .. })),
                "{bad}"
            );
        }
        assert!(matches!(
            v5.apply(&SchemaChange::DropColumn {
                name: "nope".into()
            }),
            Err(SchemaError::Column { .. })
        ));
        assert!(matches!(
            v5.apply(&SchemaChange::AddColumn {
                name: "kind".into(),
                ty: ColumnType::Text,
                nullable: true,
                default: None,
            }),
            Err(SchemaError::Column { .. })
        ));
    }

    #[test]
    fn non_finite_float_constants_are_stored_and_read_back() {
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0] {
            let s = events()
                .apply(&SchemaChange::AddColumn {
                    name: "x".into(),
                    ty: ColumnType::Float64,
                    nullable: true,
                    default: Some(Value::Float(v)),
                })
                .unwrap();
            let json = s.to_checked_json().unwrap();
            assert_eq!(TableSchema::from_json(&json).unwrap(), s, "{v}");
        }
        // An integer default follows its column to DOUBLE PRECISION.
        let s = events()
            .apply(&SchemaChange::AddColumn {
                name: "n".into(),
                ty: ColumnType::Int32,
                nullable: false,
                default: Some(Value::Int(5)),
            })
            .unwrap()
            .apply(&SchemaChange::SetType {
                name: "n".into(),
                ty: ColumnType::Float64,
            })
            .unwrap();
        assert_eq!(s.column("n").unwrap().missing, Some(Value::Float(5.0)));
    }

    #[test]
    fn the_stored_form_round_trips_and_an_unknown_format_is_refused() {
        let s = events()
            .apply(&SchemaChange::AddColumn {
                name: "blob".into(),
                ty: ColumnType::Bytea,
                nullable: true,
                default: Some(Value::Bytes(vec![1, 2])),
            })
            .unwrap();
        assert_eq!(TableSchema::from_json(&s.to_json()).unwrap(), s);
        let future = s.to_json().replace("\"format\":1", "\"format\":2");
        assert!(matches!(
            TableSchema::from_json(&future),
            Err(SchemaError::Stored(m)) if m.contains("upgrade")
        ));
        let field = s.arrow_schema().field(4).clone();
        assert_eq!(field.metadata().get("PARQUET:field_id").unwrap(), "2");
    }
}
