//! Tests of the JSON columns layout: every type and awkward value back bit for bit, rows
//! of older schemas, damaged lines, decimals at every scale.

use super::*;
use crate::model::schema::row::RowEncoder;
use crate::model::schema::{KeyColumn, KeyType, SchemaChange, TableSchema};
use datafusion::arrow::array::{
    BinaryArray, BooleanArray, Date32Array, Decimal128Array, Float32Array, Float64Array,
    Int16Array, Int32Array, Int64Array, StringArray, TimestampMicrosecondArray,
};

fn key(name: &str) -> KeyColumn {
    KeyColumn {
        name: name.into(),
        ty: KeyType::Int64,
    }
}

fn records(values: &[Vec<u8>]) -> Vec<Record> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            partition_key: PartitionKey::from_i64(3),
            event_time: EventTime::from_micros(1_000_000 + i as i64).unwrap(),
            sort_key: SortKey::from_i64(i as i64),
            value: v.clone(),
        })
        .collect()
}

fn lines(buf: &[u8]) -> Vec<&[u8]> {
    buf.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn every_type_and_awkward_value_comes_back_bit_for_bit() {
    let schema = TableSchema::new(
        key("p"),
        "at".into(),
        key("s"),
        vec![
            ("b".into(), ColumnType::Boolean, true, None),
            ("i2".into(), ColumnType::Int16, true, None),
            ("i4".into(), ColumnType::Int32, true, None),
            ("i8".into(), ColumnType::Int64, true, None),
            ("f4".into(), ColumnType::Float32, true, None),
            ("f8".into(), ColumnType::Float64, true, None),
            (
                "d".into(),
                ColumnType::Decimal {
                    precision: 38,
                    scale: 4,
                },
                true,
                None,
            ),
            ("t".into(), ColumnType::Text, true, None),
            ("y".into(), ColumnType::Bytea, true, None),
            ("ts".into(), ColumnType::TimestampTz, true, None),
            ("day".into(), ColumnType::Date, true, None),
            ("j".into(), ColumnType::Json, true, None),
        ],
    )
    .unwrap();
    let odd_nan = f64::from_bits(0xfff8_0000_0000_0001);
    let odd_nan32 = f32::from_bits(0xffc0_0001);
    let cols: Vec<ArrayRef> = vec![
        Arc::new(BooleanArray::from(vec![
            Some(true),
            Some(false),
            None,
            None,
        ])),
        Arc::new(Int16Array::from(vec![
            Some(i16::MIN),
            Some(-1),
            None,
            Some(7),
        ])),
        Arc::new(Int32Array::from(vec![
            Some(i32::MAX),
            Some(0),
            None,
            Some(7),
        ])),
        Arc::new(Int64Array::from(vec![
            Some(i64::MIN),
            Some(i64::MAX),
            None,
            Some(7),
        ])),
        Arc::new(Float32Array::from(vec![
            Some(0.1),
            Some(odd_nan32),
            Some(f32::NAN),
            Some(-0.0),
        ])),
        Arc::new(Float64Array::from(vec![
            Some(0.1),
            Some(odd_nan),
            Some(f64::NEG_INFINITY),
            Some(5e-324),
        ])),
        Arc::new(
            Decimal128Array::from(vec![Some(-5), Some(10i128.pow(37)), None, Some(0)])
                .with_precision_and_scale(38, 4)
                .unwrap(),
        ),
        Arc::new(StringArray::from(vec![
            Some("a \"quoted\"\nline\u{1F600}"),
            Some(""),
            None,
            Some("null"),
        ])),
        Arc::new(BinaryArray::from(vec![
            Some(&[][..]),
            Some(&[0u8, 255][..]),
            None,
            Some(&b"\\x"[..]),
        ])),
        Arc::new(
            TimestampMicrosecondArray::from(vec![
                Some(0),
                Some(-62_135_596_800_000_001),
                None,
                Some(253_402_300_800_000_000),
            ])
            .with_timezone("UTC"),
        ),
        Arc::new(Date32Array::from(vec![
            Some(0),
            Some(-719_163),
            None,
            Some(2_932_897),
        ])),
        Arc::new(StringArray::from(vec![
            Some(r#"{"a": [1, 2.50, "x"], "b": null}"#),
            Some("{\"a\":\n1}"),
            None,
            Some("null"),
        ])),
    ];
    let enc = RowEncoder::new(&schema, &cols).unwrap();
    let values: Vec<Vec<u8>> = (0..4).map(|r| enc.encode(r).unwrap()).collect();
    let recs = records(&values);
    let layout = ValueColumns::new(schema.clone());
    let mut buf = Vec::new();
    encode_lines("k", &layout, &recs, &mut buf).unwrap();
    let text = String::from_utf8(buf.clone()).unwrap();
    // Readable by name: the first row's values as JSON says them.
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(first["value"]["d"], "-0.0005");
    assert_eq!(first["value"]["j"]["a"][1], 2.5);
    assert_eq!(first["value"]["y"], "\\x");
    assert_eq!(first["value"]["ts"], "1970-01-01T00:00:00.000000Z");
    assert!(first.get("residual").is_none(), "{text}");
    // The odd NaNs, the JSON text with a line break and the JSON text `null` are exact
    // in the residual; years outside 1 to 9999 are integers.
    let second: serde_json::Value = serde_json::from_str(text.lines().nth(1).unwrap()).unwrap();
    assert_eq!(second["value"]["f8"], "NaN");
    assert!(second["residual"].is_string());
    assert!(second["value"]["ts"].is_i64());
    assert!(second["value"]["day"].is_i64());
    let fourth: serde_json::Value = serde_json::from_str(text.lines().nth(3).unwrap()).unwrap();
    assert_eq!(
        fourth["value"]["j"], "null",
        "the JSON text null is a string here"
    );
    assert_eq!(fourth["value"]["t"], "null");
    assert!(other_readers_take(
        r#"{"a": "\\ud800 is text", "b": [[1]]}"#
    ));
    assert!(!other_readers_take(r#""\ud800""#));
    assert!(!other_readers_take(r#"["\uDFFF"]"#));
    assert!(!other_readers_take(&format!(
        "{}{}",
        "[".repeat(65),
        "]".repeat(65)
    )));
    assert!(other_readers_take(&format!(
        "{}{}",
        "[".repeat(64),
        "]".repeat(64)
    )));
    assert!(other_readers_take(r#""[[[[ not nesting""#));
    let cols = JsonColumns {
        columns: schema
            .columns
            .iter()
            .map(|c| (c.id, c.name.clone(), c.ty))
            .collect(),
    };
    assert_eq!(decode_lines("k", &cols, &lines(&buf), 1).unwrap(), recs);
}

#[test]
fn rows_of_older_schemas_keep_their_bytes_and_bad_lines_are_refused() {
    let v1 = TableSchema::new(
        key("p"),
        "at".into(),
        key("s"),
        vec![
            ("a".into(), ColumnType::Int32, true, None),
            ("b".into(), ColumnType::Text, true, None),
        ],
    )
    .unwrap();
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Int32Array::from(vec![Some(7), None])),
        Arc::new(StringArray::from(vec![Some("x"), Some("y")])),
    ];
    let enc = RowEncoder::new(&v1, &cols).unwrap();
    let old = vec![enc.encode(0).unwrap(), enc.encode(1).unwrap()];
    let v2 = v1
        .apply(&SchemaChange::SetType {
            name: "a".into(),
            ty: ColumnType::Int64,
        })
        .unwrap()
        .apply(&SchemaChange::DropColumn { name: "b".into() })
        .unwrap()
        .apply(&SchemaChange::AddColumn {
            name: "c".into(),
            ty: ColumnType::Text,
            nullable: true,
            default: None,
        })
        .unwrap();
    let recs = records(&old);
    let layout = ValueColumns::new(v2.clone());
    let mut buf = Vec::new();
    encode_lines("k", &layout, &recs, &mut buf).unwrap();
    let cols = JsonColumns::from_header("k", &JsonColumns::header(&layout)).unwrap();
    assert_eq!(decode_lines("k", &cols, &lines(&buf), 1).unwrap(), recs);
    let text = String::from_utf8(buf).unwrap();
    assert!(
        text.contains(r#""value":{"a":7,"c":null},"residual":""#),
        "{text}"
    );
    // Damage is named, never a row.
    for (bad, why) in [
        (text.replace(r#""a":7,"#, ""), "values for"),
        (text.replace(r#""a":7"#, r#""a":"7""#), "a: not a bigint"),
        (
            text.replace(r#""a":7"#, r#""z":7"#),
            "no value for column a",
        ),
        (
            text.replace(r#","residual":""#, r#","residual":"zz"#),
            "residual",
        ),
        (
            text.replace(r#""c":null"#, r#""c":null,"extra":1"#),
            "values for",
        ),
    ] {
        let e = decode_lines("k", &cols, &lines(bad.as_bytes()), 1).unwrap_err();
        assert!(e.to_string().contains(why), "{e}");
    }
}

#[test]
fn decimals_round_trip_at_every_scale() {
    for (v, s, text) in [
        (12345i128, 2i8, "123.45"),
        (-5, 2, "-0.05"),
        (0, 3, "0.000"),
        (7, 0, "7"),
        (-12, -2, "-1200"),
        (0, -2, "0"),
        (i128::MAX, 10, "17014118346046923173168730371.5884105727"),
    ] {
        assert_eq!(format_decimal(v, s), text);
        assert_eq!(parse_decimal(text, s), Some(v), "{text}");
    }
    for (text, s) in [
        ("1.2", 2),
        ("1.234", 2),
        ("12", 2),
        ("1e3", 0),
        ("10", -2),
        ("-0", -1),
        (".50", 2),
    ] {
        assert_eq!(parse_decimal(text, s), None, "{text} at scale {s}");
    }
}
