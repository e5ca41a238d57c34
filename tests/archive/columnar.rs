//! Columnar payloads (a declared table's, record schema 3) on every backend: a scan that
//! reads some value columns fetches only those, and predicates on value columns skip row
//! groups and pages from statistics and drop rows before decoding, returning exactly the
//! rows that match, including for a column widened since the payload was written, for
//! floating point with NaN, and for NULL tests. Without `ValueRead` the scan gives every
//! row's stored bytes back exactly, as before.

use super::*;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, Int32Array, Int64Array, StringArray,
};
use datafusion::arrow::datatypes::{Float64Type, Int64Type};
use datafusion::arrow::record_batch::RecordBatch;
use pulpitum::archive::ValueColumns;
use pulpitum::model::schema::predicate::{CmpOp, Test, ValuePredicate, ValueRead};
use pulpitum::model::schema::row::{RowDecoder, RowEncoder};
use pulpitum::model::schema::{ColumnType, KeyColumn, KeyType, SchemaChange, TableSchema};

const ROWS: usize = 15_000;

/// `n INTEGER` (the row number, NULL every 97th), `label TEXT`, `x DOUBLE PRECISION` (NaN
/// every 50th), `big TEXT` (400 incompressible characters): the columns a query may skip.
fn schema() -> TableSchema {
    TableSchema::new(
        KeyColumn {
            name: "p".into(),
            ty: KeyType::Int64,
        },
        "at".into(),
        KeyColumn {
            name: "s".into(),
            ty: KeyType::Bytea,
        },
        vec![
            ("n".into(), ColumnType::Int32, true, None),
            ("label".into(), ColumnType::Text, true, None),
            ("x".into(), ColumnType::Float64, true, None),
            ("big".into(), ColumnType::Text, true, None),
        ],
    )
    .unwrap()
}

fn noise(i: usize) -> String {
    let mut x = (i as u64 + 7).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..400)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect()
}

/// The records of one bucket, values encoded under `schema`.
fn rows(b: &BucketId, schema: &TableSchema) -> Vec<Record> {
    let mut rs = records(b, ROWS, 0);
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Int32Array::from_iter(
            (0..ROWS).map(|i| (i % 97 != 5).then_some(i as i32)),
        )),
        Arc::new(StringArray::from_iter_values(
            (0..ROWS).map(|i| format!("l{}", i % 10)),
        )),
        Arc::new(Float64Array::from_iter_values((0..ROWS).map(|i| {
            if i % 50 == 0 {
                f64::NAN
            } else {
                (i % 10) as f64
            }
        }))),
        Arc::new(StringArray::from_iter_values((0..ROWS).map(noise))),
    ];
    let enc = RowEncoder::new(schema, &cols).unwrap();
    for (i, r) in rs.iter_mut().enumerate() {
        r.value = enc.encode(i).unwrap();
    }
    rs
}

/// The `n`, `label` and `x` of every returned row, decoded under `schema`.
fn decoded(schema: &TableSchema, batches: &[RecordBatch]) -> Vec<(Option<i64>, String, u64)> {
    let dec = RowDecoder::new(schema, &[0, 1, 2]);
    let mut out = Vec::new();
    for b in batches {
        let values = b.column_by_name("value").unwrap().as_binary::<i32>();
        let cols = dec.decode(values).unwrap();
        let n = datafusion::arrow::compute::cast(
            &cols[0],
            &datafusion::arrow::datatypes::DataType::Int64,
        )
        .unwrap();
        let n = n.as_primitive::<Int64Type>();
        let l = cols[1].as_string::<i32>();
        let x = cols[2].as_primitive::<Float64Type>();
        for i in 0..b.num_rows() {
            out.push((
                n.is_valid(i).then(|| n.value(i)),
                l.value(i).to_string(),
                // As bits: NaN is not equal to itself.
                x.value(i).to_bits(),
            ));
        }
    }
    out
}

fn expected(
    schema: &TableSchema,
    rs: &[Record],
    keep: impl Fn(&(Option<i64>, String, u64)) -> bool,
) -> Vec<(Option<i64>, String, u64)> {
    let b = pulpitum::archive::records_to_batch(rs, true);
    decoded(schema, &[b])
        .into_iter()
        .filter(|r| keep(r))
        .collect()
}

fn cmp(schema: &TableSchema, name: &str, op: CmpOp, lit: ArrayRef) -> ValuePredicate {
    let c = schema.column(name).unwrap();
    ValuePredicate::compare(c.id, name, c.ty, op, lit).unwrap()
}

async fn scan(
    s: &ArchiveStore,
    m: &Manifest,
    value: ValueRead,
) -> (Vec<RecordBatch>, pulpitum::archive::ScanMetricsSnapshot) {
    let metrics = Arc::new(ArchiveScanMetrics::default());
    let req = ArchiveScan {
        value,
        ..ArchiveScan::default()
    };
    let mut st = s.scan_with_metrics(m, &req, metrics.clone()).await.unwrap();
    let mut out = Vec::new();
    while let Some(b) = st.next().await {
        out.push(b.unwrap());
    }
    (out, metrics.snapshot())
}

#[tokio::test]
async fn columnar_scans_read_the_columns_and_rows_asked_for() {
    for be in backends("columnar").await {
        let s = &be
            .store
            .clone()
            .with_row_group_rows(5_000)
            .with_block_size(16 * 1024);
        let b = bucket("2024-07-06", 9);
        let v1 = schema();
        let rs = rows(&b, &v1);
        let w = s
            .write_bucket_with(
                &b,
                2,
                PayloadFormat::Parquet,
                Some(&ValueColumns::new(v1.clone())),
                pages(&rs, 4_096),
            )
            .await
            .map_err(WriteError::into_archive)
            .unwrap();
        let m = &w.manifest;
        // The column was widened since the payload was written: predicates and reads speak
        // BIGINT, the file INTEGER.
        let v2 = v1
            .apply(&SchemaChange::SetType {
                name: "n".into(),
                ty: ColumnType::Int64,
            })
            .unwrap();
        let name = be.name;

        // Everything, exactly as stored.
        let (all, full) = scan(s, m, ValueRead::default()).await;
        assert_eq!(batches_to_records(&all).unwrap(), rs, "{name}");

        // One small column: the large one is never fetched.
        let id = |c: &str| v2.column(c).unwrap().id;
        let only_n = ValueRead {
            fields: Some(vec![id("n")].into()),
            filters: Arc::new([]),
        };
        let (got, few) = scan(s, m, only_n).await;
        let n_of = |bs: &[RecordBatch]| -> Vec<Option<i64>> {
            decoded(&v2, bs).into_iter().map(|r| r.0).collect()
        };
        let dec = RowDecoder::new(&v2, &[0]);
        let mut ns = Vec::new();
        for bt in &got {
            let c = dec
                .decode(bt.column_by_name("value").unwrap().as_binary::<i32>())
                .unwrap();
            let c = c[0].as_primitive::<Int64Type>();
            ns.extend((0..c.len()).map(|i| c.is_valid(i).then(|| c.value(i))));
        }
        assert_eq!(ns, n_of(&all), "{name}");
        assert!(
            few.bytes_read * 4 < full.bytes_read,
            "{name}: one column read {} bytes, every column {}",
            few.bytes_read,
            full.bytes_read
        );

        // A range on the widened column: two of three row groups skipped from statistics,
        // pages of the third from the page index, and exactly the matching rows returned.
        let range = ValueRead {
            fields: None,
            filters: vec![
                cmp(
                    &v2,
                    "n",
                    CmpOp::GtEq,
                    Arc::new(Int64Array::from(vec![12_000])),
                ),
                cmp(
                    &v2,
                    "n",
                    CmpOp::Lt,
                    Arc::new(Int64Array::from(vec![12_100])),
                ),
            ]
            .into(),
        };
        let (got, snap) = scan(s, m, range).await;
        let want = expected(&v2, &rs, |r| {
            r.0.is_some_and(|n| (12_000..12_100).contains(&n))
        });
        assert_eq!(decoded(&v2, &got), want, "{name}");
        assert_eq!(snap.row_groups_pruned, 2, "{name}: {snap:?}");
        assert!(snap.pages_pruned > 0, "{name}: {snap:?}");
        assert!(snap.bytes_read * 3 < full.bytes_read, "{name}: {snap:?}");
        // Rows kept are whole: their stored bytes, not a partial value.
        let kept = batches_to_records(&got).unwrap();
        assert!(kept.iter().all(|r| rs.contains(r)), "{name}");

        // Text equality: no statistics help (every row group holds every label), rows do.
        let label = ValueRead {
            fields: Some(vec![id("n"), id("label"), id("x")].into()),
            filters: vec![cmp(
                &v2,
                "label",
                CmpOp::Eq,
                Arc::new(StringArray::from(vec!["l3"])),
            )]
            .into(),
        };
        let (got, snap) = scan(s, m, label).await;
        assert_eq!(
            decoded(&v2, &got),
            expected(&v2, &rs, |r| r.1 == "l3"),
            "{name}"
        );
        assert_eq!(snap.rows_returned, (ROWS / 10) as u64, "{name}");

        // Floating point: NaN is above every number in SQL, and Parquet's statistics leave
        // it out, so nothing is skipped from them and every NaN row comes back.
        let nan = ValueRead {
            fields: Some(vec![id("n"), id("label"), id("x")].into()),
            filters: vec![cmp(
                &v2,
                "x",
                CmpOp::Gt,
                Arc::new(Float64Array::from(vec![100.0])),
            )]
            .into(),
        };
        let (got, snap) = scan(s, m, nan).await;
        let got = decoded(&v2, &got);
        assert_eq!(got.len(), ROWS / 50, "{name}");
        assert!(got.iter().all(|r| f64::from_bits(r.2).is_nan()), "{name}");
        assert_eq!(snap.row_groups_pruned, 0, "{name}");

        // NULL tests.
        let c = v2.column("n").unwrap();
        let nulls = ValueRead {
            fields: None,
            filters: vec![ValuePredicate {
                field: c.id,
                name: "n".into(),
                ty: c.ty,
                test: Test::IsNull,
            }]
            .into(),
        };
        let (got, _) = scan(s, m, nulls).await;
        assert_eq!(
            decoded(&v2, &got),
            expected(&v2, &rs, |r| r.0.is_none()),
            "{name}"
        );

        // A predicate on a field the payload predates is SQL's to apply: every row returned.
        let v3 = v2
            .apply(&SchemaChange::AddColumn {
                name: "later".into(),
                ty: ColumnType::Int64,
                nullable: true,
                default: None,
            })
            .unwrap();
        let later = ValueRead {
            fields: None,
            filters: vec![cmp(
                &v3,
                "later",
                CmpOp::Eq,
                Arc::new(Int64Array::from(vec![1])),
            )]
            .into(),
        };
        let (got, _) = scan(s, m, later).await;
        assert_eq!(batches_to_records(&got).unwrap(), rs, "{name}");
    }
}
