//! Tests of the record schema v3 row encoding.

use super::super::{KeyColumn, KeyType, SchemaChange};
use super::*;
use datafusion::arrow::array::{
    BooleanArray, Date32Array, Decimal128Array, Float32Array, Float64Array, Int16Array, Int32Array,
    Int64Array, StringArray, TimestampMicrosecondArray,
};

fn every_type() -> TableSchema {
    let cols = [
        ("b", ColumnType::Boolean),
        ("i2", ColumnType::Int16),
        ("i4", ColumnType::Int32),
        ("i8", ColumnType::Int64),
        ("f4", ColumnType::Float32),
        ("f8", ColumnType::Float64),
        (
            "d",
            ColumnType::Decimal {
                precision: 12,
                scale: 2,
            },
        ),
        ("t", ColumnType::Text),
        ("y", ColumnType::Bytea),
        ("ts", ColumnType::TimestampTz),
        ("dt", ColumnType::Date),
        ("j", ColumnType::Json),
    ];
    TableSchema::new(
        KeyColumn {
            name: "p".into(),
            ty: KeyType::Int64,
        },
        "at".into(),
        KeyColumn {
            name: "s".into(),
            ty: KeyType::Text,
        },
        cols.iter()
            .map(|(n, t)| (n.to_string(), *t, true, None))
            .collect(),
    )
    .unwrap()
}

fn arrays() -> Vec<ArrayRef> {
    vec![
        Arc::new(BooleanArray::from(vec![Some(true), None])),
        Arc::new(Int16Array::from(vec![Some(-3), None])),
        Arc::new(Int32Array::from(vec![Some(70_000), None])),
        Arc::new(Int64Array::from(vec![Some(i64::MIN), None])),
        Arc::new(Float32Array::from(vec![Some(1.5), None])),
        Arc::new(Float64Array::from(vec![Some(-0.25), None])),
        Arc::new(
            Decimal128Array::from(vec![Some(123_456), None])
                .with_precision_and_scale(12, 2)
                .unwrap(),
        ),
        Arc::new(StringArray::from(vec![Some("héllo"), None])),
        Arc::new(BinaryArray::from(vec![Some(&b"\x00\xff"[..]), None])),
        Arc::new(
            TimestampMicrosecondArray::from(vec![Some(1_700_000_000_000_001), None])
                .with_timezone("UTC"),
        ),
        Arc::new(Date32Array::from(vec![Some(19_000), None])),
        Arc::new(StringArray::from(vec![Some(r#"{"a":[1,2]}"#), None])),
    ]
}

#[test]
fn every_type_round_trips_with_nulls() {
    let s = every_type();
    let cols = arrays();
    let enc = RowEncoder::new(&s, &cols).unwrap();
    let (r0, r1) = (enc.encode(0).unwrap(), enc.encode(1).unwrap());
    let rows = BinaryArray::from(vec![r0.as_slice(), r1.as_slice()]);
    let all: Vec<usize> = (0..s.columns.len()).collect();
    let got = RowDecoder::new(&s, &all).decode(&rows).unwrap();
    for (g, w) in got.iter().zip(&cols) {
        assert_eq!(g.as_ref(), w.as_ref());
    }
    // A projection decodes only what it asks for, in its order.
    let got = RowDecoder::new(&s, &[7, 0]).decode(&rows).unwrap();
    assert_eq!(got[0].as_ref(), cols[7].as_ref());
    assert_eq!(got[1].as_ref(), cols[0].as_ref());
}

#[test]
fn older_rows_read_through_later_schemas_by_field_id() {
    let v1 = every_type();
    let cols = arrays();
    let row = RowEncoder::new(&v1, &cols).unwrap().encode(0).unwrap();
    let v2 = v1
        .apply(&SchemaChange::RenameColumn {
            from: "i4".into(),
            to: "n".into(),
        })
        .unwrap()
        .apply(&SchemaChange::SetType {
            name: "n".into(),
            ty: ColumnType::Int64,
        })
        .unwrap()
        .apply(&SchemaChange::DropColumn { name: "t".into() })
        .unwrap()
        .apply(&SchemaChange::AddColumn {
            name: "t".into(),
            ty: ColumnType::Text,
            nullable: false,
            default: Some(Value::Text("none".into())),
        })
        .unwrap();
    let n = v2.columns.iter().position(|c| c.name == "n").unwrap();
    let t = v2.columns.iter().position(|c| c.name == "t").unwrap();
    let got = RowDecoder::new(&v2, &[n, t])
        .decode(&BinaryArray::from(vec![row.as_slice()]))
        .unwrap();
    assert_eq!(got[0].as_primitive::<Int64Type>().value(0), 70_000);
    // The new `t` is not the dropped `t`: the old row reads the missing value.
    assert_eq!(got[1].as_string::<i32>().value(0), "none");
}

#[test]
fn damaged_rows_and_bad_values_are_refused_by_name() {
    let s = every_type();
    let cols = arrays();
    let row = RowEncoder::new(&s, &cols).unwrap().encode(0).unwrap();
    let all: Vec<usize> = (0..s.columns.len()).collect();
    let dec = RowDecoder::new(&s, &all);
    // (A row of the header alone is valid: no field written, every column absent.)
    for cut in [2, 5, row.len() - 1] {
        let err = dec
            .decode(&BinaryArray::from(vec![&row[..cut]]))
            .unwrap_err();
        assert!(matches!(err, RowError::Corrupt(_)), "{cut}: {err}");
    }
    let mut v2 = row.clone();
    v2[0] = 2;
    assert!(dec.decode(&BinaryArray::from(vec![v2.as_slice()])).is_err());
    // A text value stored where an integer column is.
    let wrong = vec![ROW_FORMAT, 3, T_TEXT, 1, b'x'];
    let err = dec
        .decode(&BinaryArray::from(vec![wrong.as_slice()]))
        .unwrap_err();
    assert!(err.to_string().contains("column i4"), "{err}");
    let mut bad_json = cols.clone();
    bad_json[11] = Arc::new(StringArray::from(vec![Some("{nope"), None]));
    let err = RowEncoder::new(&s, &bad_json)
        .unwrap()
        .encode(0)
        .unwrap_err();
    assert!(err.to_string().contains("column j"), "{err}");
}
