//! Declared tables (record schema v3) against PostgreSQL given the same DDL: a table with
//! every value type, rows across per-bucket JSON archives, segments, per-bucket Parquet and
//! hot buckets, columns added, renamed, dropped and widened in between, rows updated and
//! deleted across tiers, read back row for row and cell for cell against a real PostgreSQL
//! table that went through the same statements. On PostgreSQL and the embedded store, both
//! with the real S3.

mod archiver_support;
mod changes_support;

use std::sync::Arc;

use archiver_support::{fresh_archive_url, fresh_database, open};
use changes_support::{DAY_US, START};
use chrono::{DateTime, NaiveDate, Utc};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BooleanArray, Date32Array, Decimal128Array,
    Float32Array, Float64Array, Int16Array, Int32Array, Int64Array, StringArray,
    TimestampMicrosecondArray,
};
use datafusion::arrow::datatypes::{
    DataType, Date32Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type,
    TimestampMicrosecondType,
};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use pulpitum::archive::PayloadFormat;
use pulpitum::archiver::{ArchiverConfig, Runner};
use pulpitum::model::EventTime;
use pulpitum::session::{session, SessionOptions};
use pulpitum::store::HotStore;
use tokio_util::sync::CancellationToken;

const CREATE: &str = "CREATE EXTERNAL TABLE events (tenant_id BIGINT NOT NULL, \
    at TIMESTAMPTZ NOT NULL, seq BIGINT NOT NULL, kind TEXT NOT NULL, amount DOUBLE PRECISION, \
    note TEXT, flag BOOLEAN, small SMALLINT, mid INTEGER, price NUMERIC(12, 2), blob BYTEA, \
    day DATE, seen TIMESTAMPTZ, payload JSON, ratio REAL) STORED AS PULPITUM LOCATION '' \
    OPTIONS ('partition_by' 'tenant_id', 'time' 'at', 'order_by' 'seq', \
    'bucket_strategy' 'calendar_day_utc')";

/// The same table in PostgreSQL.
const MIRROR: &str = "CREATE TABLE events (tenant_id BIGINT NOT NULL, \
    at TIMESTAMPTZ NOT NULL, seq BIGINT NOT NULL, kind TEXT NOT NULL, amount DOUBLE PRECISION, \
    note TEXT, flag BOOLEAN, small SMALLINT, mid INTEGER, price NUMERIC(12, 2), blob BYTEA, \
    day DATE, seen TIMESTAMPTZ, payload JSON, ratio REAL)";

/// Schema changes, each run on both (one statement each, as PostgreSQL takes them too).
const CHANGES: [&str; 5] = [
    "ALTER TABLE events ADD COLUMN region TEXT NOT NULL DEFAULT 'eu'",
    "ALTER TABLE events RENAME COLUMN note TO memo",
    "ALTER TABLE events DROP COLUMN flag",
    "ALTER TABLE events ALTER COLUMN mid TYPE BIGINT",
    "ALTER TABLE events ALTER COLUMN ratio TYPE DOUBLE PRECISION",
];

/// One generated row: `(tenant, day, k)` and the values every column takes from them.
#[derive(Clone, Copy)]
struct Gen {
    tenant: i64,
    day: i64,
    k: i64,
}

impl Gen {
    fn seq(self) -> i64 {
        self.tenant * 1000 + self.day * 10 + self.k
    }
    fn at_us(self) -> i64 {
        EventTime::parse_rfc3339(START).unwrap().as_micros() + self.day * DAY_US + self.k * 1_000
    }
}

/// A cell as both sides can be compared.
#[derive(Debug, Clone, PartialEq)]
enum Cell {
    Null,
    Int(i64),
    Float(f64),
    Text(String),
    Bool(bool),
    Bytes(Vec<u8>),
    Micros(i64),
    Days(i32),
}

/// The generated rows as a batch in the table's current schema (columns by name; a column
/// the generator has no value for is left out of `names`).
fn batch(schema: &datafusion::arrow::datatypes::Schema, rows: &[Gen]) -> RecordBatch {
    let cols: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| -> ArrayRef {
            let s = |g: &Gen| g.seq();
            match (f.name().as_str(), f.data_type()) {
                ("tenant_id", _) => {
                    Arc::new(Int64Array::from_iter_values(rows.iter().map(|g| g.tenant)))
                }
                ("at", _) => Arc::new(
                    TimestampMicrosecondArray::from_iter_values(rows.iter().map(|g| g.at_us()))
                        .with_timezone("UTC"),
                ),
                ("seq", _) => Arc::new(Int64Array::from_iter_values(rows.iter().map(s))),
                ("kind", _) => Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|g| format!("k{}", s(g) % 3)),
                )),
                ("amount", _) => Arc::new(Float64Array::from_iter(
                    rows.iter()
                        .map(|g| (s(g) % 5 != 0).then(|| s(g) as f64 * 0.5)),
                )),
                ("note" | "memo", _) => Arc::new(StringArray::from_iter(
                    rows.iter()
                        .map(|g| (s(g) % 4 != 0).then(|| format!("n{}", s(g)))),
                )),
                ("flag", _) => Arc::new(BooleanArray::from_iter(
                    rows.iter().map(|g| Some(s(g) % 2 == 0)),
                )),
                ("small", _) => Arc::new(Int16Array::from_iter(
                    rows.iter().map(|g| Some((s(g) % 300) as i16)),
                )),
                ("mid", DataType::Int32) => Arc::new(Int32Array::from_iter(
                    rows.iter().map(|g| Some(s(g) as i32 * 1000)),
                )),
                ("mid", _) => Arc::new(Int64Array::from_iter(
                    rows.iter().map(|g| Some(s(g) * 3_000_000_000)),
                )),
                ("price", _) => Arc::new(
                    Decimal128Array::from_iter(
                        rows.iter()
                            .map(|g| (s(g) % 6 != 0).then(|| i128::from(s(g)) * 101)),
                    )
                    .with_precision_and_scale(12, 2)
                    .unwrap(),
                ),
                ("blob", _) => Arc::new(BinaryArray::from_iter(
                    rows.iter().map(|g| Some(vec![(s(g) % 256) as u8, 0xff, 0])),
                )),
                ("day", _) => Arc::new(Date32Array::from_iter(
                    rows.iter().map(|g| Some(18_000 + g.day as i32)),
                )),
                ("seen", _) => Arc::new(
                    TimestampMicrosecondArray::from_iter(
                        rows.iter().map(|g| (s(g) % 7 != 1).then(|| g.at_us() + 1)),
                    )
                    .with_timezone("UTC"),
                ),
                ("payload", _) => {
                    Arc::new(StringArray::from_iter(rows.iter().map(|g| {
                        Some(format!(r#"{{"s": {}, "t": [1, 2.5, "x"]}}"#, s(g)))
                    })))
                }
                ("ratio", DataType::Float32) => Arc::new(Float32Array::from_iter(
                    rows.iter().map(|g| Some(s(g) as f32 / 4.0)),
                )),
                ("ratio", _) => Arc::new(Float64Array::from_iter(
                    rows.iter().map(|g| Some(s(g) as f64 / 8.0)),
                )),
                ("region", _) => Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|g| format!("r{}", g.tenant)),
                )),
                (other, _) => panic!("no generator for {other}"),
            }
        })
        .collect();
    RecordBatch::try_new(Arc::new(schema.clone()), cols).unwrap()
}

/// Inserts the rows into PostgreSQL with parameters, each column converted from the
/// batch's cell.
async fn pg_insert(pg: &tokio_postgres::Client, b: &RecordBatch) {
    let names: Vec<String> = b
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let casts: Vec<String> = b
        .schema()
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| match f.name().as_str() {
            "price" => format!("${}::TEXT::NUMERIC", i + 1),
            "payload" => format!("${}::TEXT::JSON", i + 1),
            _ => format!("${}", i + 1),
        })
        .collect();
    let sql = format!(
        "INSERT INTO events ({}) VALUES ({})",
        names.join(", "),
        casts.join(", ")
    );
    let stmt = pg.prepare(&sql).await.unwrap();
    for row in 0..b.num_rows() {
        let mut params: Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>> = Vec::new();
        for c in b.columns() {
            let null = c.is_null(row);
            params.push(match c.data_type() {
                DataType::Int64 => {
                    Box::new((!null).then(|| c.as_primitive::<Int64Type>().value(row)))
                }
                DataType::Int32 => {
                    Box::new((!null).then(|| c.as_primitive::<Int32Type>().value(row)))
                }
                DataType::Int16 => {
                    Box::new((!null).then(|| c.as_primitive::<Int16Type>().value(row)))
                }
                DataType::Float64 => {
                    Box::new((!null).then(|| c.as_primitive::<Float64Type>().value(row)))
                }
                DataType::Float32 => {
                    Box::new((!null).then(|| c.as_primitive::<Float32Type>().value(row)))
                }
                DataType::Boolean => Box::new((!null).then(|| c.as_boolean().value(row))),
                DataType::Utf8 => {
                    Box::new((!null).then(|| c.as_string::<i32>().value(row).to_string()))
                }
                DataType::Binary => {
                    Box::new((!null).then(|| c.as_binary::<i32>().value(row).to_vec()))
                }
                DataType::Date32 => Box::new((!null).then(|| {
                    NaiveDate::from_ymd_opt(1970, 1, 1).unwrap()
                        + chrono::Duration::days(c.as_primitive::<Date32Type>().value(row).into())
                })),
                DataType::Timestamp(..) => Box::new((!null).then(|| {
                    DateTime::<Utc>::from_timestamp_micros(
                        c.as_primitive::<TimestampMicrosecondType>().value(row),
                    )
                    .unwrap()
                })),
                DataType::Decimal128(_, _) => Box::new((!null).then(|| {
                    let a = c.as_any().downcast_ref::<Decimal128Array>().unwrap();
                    a.value_as_string(row)
                })),
                other => panic!("no PostgreSQL parameter for {other}"),
            });
        }
        let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            params.iter().map(|p| p.as_ref() as _).collect();
        pg.execute(&stmt, &refs).await.unwrap();
    }
}

fn arrow_cells(batches: &[RecordBatch]) -> Vec<Vec<Cell>> {
    let mut out = Vec::new();
    for b in batches {
        for row in 0..b.num_rows() {
            out.push(
                b.columns()
                    .iter()
                    .map(|c| {
                        if c.is_null(row) {
                            return Cell::Null;
                        }
                        match c.data_type() {
                            DataType::Int64 => Cell::Int(c.as_primitive::<Int64Type>().value(row)),
                            DataType::Int32 => {
                                Cell::Int(c.as_primitive::<Int32Type>().value(row).into())
                            }
                            DataType::Int16 => {
                                Cell::Int(c.as_primitive::<Int16Type>().value(row).into())
                            }
                            DataType::Float64 => {
                                Cell::Float(c.as_primitive::<Float64Type>().value(row))
                            }
                            DataType::Float32 => {
                                Cell::Float(c.as_primitive::<Float32Type>().value(row).into())
                            }
                            DataType::Boolean => Cell::Bool(c.as_boolean().value(row)),
                            DataType::Utf8 => {
                                Cell::Text(c.as_string::<i32>().value(row).to_string())
                            }
                            DataType::Utf8View => {
                                Cell::Text(c.as_string_view().value(row).to_string())
                            }
                            DataType::Binary => {
                                Cell::Bytes(c.as_binary::<i32>().value(row).to_vec())
                            }
                            DataType::Date32 => {
                                Cell::Days(c.as_primitive::<Date32Type>().value(row))
                            }
                            DataType::Timestamp(..) => Cell::Micros(
                                c.as_primitive::<TimestampMicrosecondType>().value(row),
                            ),
                            other => panic!("no cell for {other}"),
                        }
                    })
                    .collect(),
            );
        }
    }
    out
}

fn pg_cells(rows: &[tokio_postgres::Row]) -> Vec<Vec<Cell>> {
    use tokio_postgres::types::Type;
    rows.iter()
        .map(|r| {
            r.columns()
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let t = c.type_();
                    macro_rules! get {
                        ($ty:ty, $f:expr) => {
                            r.get::<_, Option<$ty>>(i).map_or(Cell::Null, $f)
                        };
                    }
                    match *t {
                        Type::INT8 => get!(i64, Cell::Int),
                        Type::INT4 => get!(i32, |v| Cell::Int(v.into())),
                        Type::INT2 => get!(i16, |v| Cell::Int(v.into())),
                        Type::FLOAT8 => get!(f64, Cell::Float),
                        Type::FLOAT4 => get!(f32, |v| Cell::Float(v.into())),
                        Type::BOOL => get!(bool, Cell::Bool),
                        Type::TEXT => get!(String, Cell::Text),
                        Type::BYTEA => get!(Vec<u8>, Cell::Bytes),
                        Type::DATE => get!(NaiveDate, |d| Cell::Days(
                            (d - NaiveDate::from_ymd_opt(1970, 1, 1).unwrap()).num_days() as i32
                        )),
                        Type::TIMESTAMPTZ => {
                            get!(DateTime<Utc>, |d| Cell::Micros(d.timestamp_micros()))
                        }
                        ref other => panic!("no cell for PostgreSQL type {other}"),
                    }
                })
                .collect()
        })
        .collect()
}

struct Both {
    ctx: SessionContext,
    store: Arc<dyn HotStore>,
    archive: Arc<pulpitum::archive::ArchiveStore>,
    pg: tokio_postgres::Client,
    _dir: Option<tempfile::TempDir>,
}

impl Both {
    async fn new(label: &str, embedded: bool) -> Self {
        let archive_url = fresh_archive_url(label);
        // The mirror always lives in PostgreSQL, in a schema of its own.
        let mirror_url = fresh_database(&format!("{label}_m")).await;
        let (db, dir) = if embedded {
            let dir = tempfile::tempdir().unwrap();
            (
                format!("sqlite://{}", dir.path().join("hot.db").display()),
                Some(dir),
            )
        } else {
            (fresh_database(label).await, None)
        };
        let (store, archive) = open(&db, &archive_url).await;
        let ctx = session(
            store.clone(),
            archive.clone(),
            SessionOptions {
                page_rows: 5,
                ..SessionOptions::default()
            },
        )
        .await
        .unwrap();
        let (pg, conn) = tokio_postgres::connect(&mirror_url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        Self {
            ctx,
            store,
            archive,
            pg,
            _dir: dir,
        }
    }

    async fn ours(&self, sql: &str) -> Result<Vec<RecordBatch>, String> {
        let df = pulpitum::control::sql(&self.ctx, sql)
            .await
            .map_err(|e| e.to_string())?;
        df.collect().await.map_err(|e| e.to_string())
    }

    /// Runs a statement on both sides.
    async fn both(&self, sql: &str) {
        self.ours(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        self.pg
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL: {sql}: {e}"));
    }

    /// Inserts generated rows on both sides (ours through SQL from a registered batch).
    async fn insert(&self, rows: &[Gen], columns: Option<&[&str]>) {
        let provider = self.ctx.table_provider("events").await.unwrap();
        let full = provider.schema();
        let schema = match columns {
            Some(names) => full
                .project(
                    &names
                        .iter()
                        .map(|n| full.index_of(n).unwrap())
                        .collect::<Vec<_>>(),
                )
                .unwrap(),
            None => full.as_ref().clone(),
        };
        let b = batch(&schema, rows);
        let mem = MemTable::try_new(b.schema(), vec![vec![b.clone()]]).unwrap();
        let _ = self.ctx.deregister_table("src");
        self.ctx.register_table("src", Arc::new(mem)).unwrap();
        let list: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        self.ours(&format!(
            "INSERT INTO events ({}) SELECT * FROM src",
            list.join(", ")
        ))
        .await
        .unwrap();
        pg_insert(&self.pg, &b).await;
    }

    /// The same query on both sides, compared cell for cell.
    async fn same(&self, sql: &str, what: &str) -> usize {
        let ours = arrow_cells(
            &self
                .ours(sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}")),
        );
        let theirs = pg_cells(
            &self
                .pg
                .query(sql, &[])
                .await
                .unwrap_or_else(|e| panic!("PostgreSQL: {sql}: {e}")),
        );
        assert_eq!(ours.len(), theirs.len(), "{what}: row counts of {sql}");
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert_eq!(a, b, "{what}: row {i} of {sql}");
        }
        ours.len()
    }

    async fn archive(&self, before: &str, format: PayloadFormat, segments: bool) {
        let mut c = ArchiverConfig::with_defaults();
        c.eligible_before = Some(EventTime::parse_rfc3339(before).unwrap());
        c.cleanup_delay = std::time::Duration::ZERO;
        c.format = format;
        c.compaction = segments;
        c.compact_after = std::time::Duration::ZERO;
        let runner = Runner::new(self.store.clone(), self.archive.clone(), c).unwrap();
        runner
            .drain(&CancellationToken::new(), &|_, _| {})
            .await
            .unwrap();
        if segments {
            let r = runner.compact_pass().await.unwrap();
            assert_eq!(r.failed, 0, "{r:?}");
        }
    }
}

const ALL_V1: &str = "SELECT tenant_id, at, seq, kind, amount, note, flag, small, mid, \
    CAST(price AS TEXT), blob, day, seen, CAST(payload AS TEXT), ratio FROM events ORDER BY tenant_id, seq";
const ALL_V2: &str = "SELECT tenant_id, at, seq, kind, amount, memo, small, mid, \
    CAST(price AS TEXT), blob, day, seen, CAST(payload AS TEXT), ratio, region FROM events \
    ORDER BY tenant_id, seq";
const AGG: &str = "SELECT kind, count(*), sum(amount), CAST(max(price) AS TEXT), max(day), \
    count(memo), CAST(sum(mid) AS BIGINT) FROM events GROUP BY kind ORDER BY kind";

fn rows(tenants: std::ops::RangeInclusive<i64>, days: &[i64]) -> Vec<Gen> {
    let mut out = Vec::new();
    for tenant in tenants {
        for &day in days {
            for k in 0..4 {
                out.push(Gen { tenant, day, k });
            }
        }
    }
    out
}

async fn declared(embedded: bool) {
    let t = Both::new(if embedded { "decl_sq" } else { "decl_pg" }, embedded).await;
    t.ours(CREATE).await.unwrap();
    // The identical CREATE again is a no-op, as for every Pulpitum table.
    t.ours(CREATE).await.unwrap();
    t.pg.batch_execute(MIRROR).await.unwrap();

    // Schema version 1: February 9 and 10, March 1 to 3.
    t.insert(&rows(1..=3, &[-20, -19, 0, 1, 2]), None).await;
    assert_eq!(t.same(ALL_V1, "hot, v1").await, 60);
    // February to Parquet, then compacted into a segment (its window is past); March 1 to
    // per-bucket JSON, March 2 to per-bucket Parquet.
    t.archive("2021-03-01T00:00:00Z", PayloadFormat::Parquet, true)
        .await;
    t.archive("2021-03-02T00:00:00Z", PayloadFormat::Json, false)
        .await;
    t.archive("2021-03-03T00:00:00Z", PayloadFormat::Parquet, false)
        .await;
    t.same(ALL_V1, "archived, v1").await;
    // Value predicates of version 1's columns (see below): booleans and lists.
    for sql in [
        "SELECT seq FROM events WHERE flag ORDER BY seq",
        "SELECT seq FROM events WHERE NOT flag AND kind IN ('k0', 'k2') ORDER BY seq",
        "SELECT seq FROM events WHERE mid IN (1001000, 2012000, 3021000, 5) ORDER BY seq",
        "SELECT seq FROM events WHERE note = 'n1001' OR note = 'n3022' ORDER BY seq",
        // DataFusion rewrites these to `mid = .. OR NULL` after they were classified.
        "SELECT seq FROM events WHERE mid IN (1001000, NULL) ORDER BY seq",
        "SELECT count(*) FROM events WHERE NOT (mid IN (1001000, NULL))",
        "SELECT seq FROM events WHERE kind IN ('k1', NULL) AND tenant_id = 3 ORDER BY seq",
    ] {
        t.same(sql, "value predicates, v1").await;
    }

    for c in CHANGES {
        t.both(c).await;
    }
    // Rows of the new shape in March 4 and 5; older rows read the added column's DEFAULT.
    t.insert(&rows(1..=3, &[3, 4]), None).await;
    t.same(ALL_V2, "after the changes").await;
    // A default changed later applies to new rows only, as in PostgreSQL.
    t.both("ALTER TABLE events ALTER COLUMN region SET DEFAULT 'us'")
        .await;
    t.insert(
        &rows(4..=4, &[4]),
        Some(&["tenant_id", "at", "seq", "kind"]),
    )
    .await;
    t.same(ALL_V2, "omitted columns").await;
    // Values a JSON payload must carry exactly (March 3, archived in JSON below): texts and
    // a JSON document with a line break, the JSON text `null` (not SQL NULL), an empty
    // text, negative zero, and decimal literals into NUMERIC and SMALLINT columns, which
    // take the value as written as in PostgreSQL (1.005 rounds to 1.01 in a NUMERIC(12,
    // 2), not to the double's 1.00; 2.5 to 3, not 2).
    t.both(
        "INSERT INTO events (tenant_id, at, seq, kind, amount, memo, price, payload, ratio, region, small) VALUES \
         (1, '2021-03-03T05:00:00Z', 1995, 'odd', 1.005, 'line\nbreak', 1.005, '{\"a\":\n 1}', 0.1, 'eu', 2.5), \
         (1, '2021-03-03T06:00:00Z', 1996, 'odd', -0.0, '', -1.005, 'null', 1e30, 'x', -2.5)",
    )
    .await;
    t.same(
        "SELECT seq, amount, memo, CAST(price AS TEXT), CAST(payload AS TEXT), ratio, small, \
         CAST(CAST(1.005 AS NUMERIC(12, 2)) * 3 AS TEXT), price > 1.005, price = 1.01 FROM events \
         WHERE kind = 'odd' AND amount > -0.5 AND amount < 1.0051 ORDER BY seq",
        "literals",
    )
    .await;

    // Changes across tiers: archived rows (masks) and hot rows.
    t.both("UPDATE events SET amount = 7.5, memo = 'edited' WHERE tenant_id = 2 AND seq % 3 = 0")
        .await;
    t.both("DELETE FROM events WHERE seq % 7 = 0").await;
    t.same(ALL_V2, "after UPDATE and DELETE").await;

    // March 3 (rows of v1, and the odd ones) in JSON and March 4 (rows of v2) in Parquet,
    // archived under the newest schema: the v1 rows carry a dropped column, widened values
    // and an added column in their residual.
    t.archive("2021-03-04T00:00:00Z", PayloadFormat::Json, false)
        .await;
    t.same(ALL_V2, "March 3 in JSON").await;
    json_reads_by_name(&t).await;
    t.archive("2021-03-05T00:00:00Z", PayloadFormat::Parquet, false)
        .await;
    let n = t.same(ALL_V2, "every tier").await;
    assert!(n > 50, "{n} rows");
    t.same(AGG, "aggregate").await;
    t.same(
        "SELECT tenant_id, seq, memo FROM events WHERE tenant_id = 2 AND seq > 2010 AND seq <= 2032 ORDER BY seq DESC",
        "pushed key filters",
    )
    .await;
    t.same(
        "SELECT seq, region, CAST(payload AS TEXT) FROM events WHERE at >= '2021-03-02T00:00:00Z' AND at < '2021-03-04T00:00:00Z' AND region = 'eu' ORDER BY seq",
        "time range and a value filter",
    )
    .await;

    // Predicates on value columns, which columnar archive reads apply early (row groups,
    // pages, rows) and SQL again above the scan: a widened column (`mid`, INTEGER in the
    // older payloads), a renamed one (`memo`), one added since (`region`, absent from the
    // older payloads), NULL tests, floating point, and rows edited in archived buckets
    // (`memo = 'edited'` holds only through the edit).
    for sql in [
        "SELECT seq, amount FROM events WHERE amount > 1000.5 ORDER BY seq",
        "SELECT seq, mid FROM events WHERE mid >= 3000000 AND mid < 6000000000000 ORDER BY seq",
        "SELECT seq FROM events WHERE small = 10 ORDER BY seq",
        "SELECT seq, kind FROM events WHERE kind = 'k1' AND tenant_id = 2 ORDER BY seq",
        "SELECT seq FROM events WHERE memo IS NULL ORDER BY seq",
        "SELECT seq, memo, amount FROM events WHERE memo = 'edited' ORDER BY seq",
        "SELECT seq, region FROM events WHERE region <> 'eu' ORDER BY seq",
        "SELECT seq FROM events WHERE day > DATE '2019-04-15' AND day <= DATE '2019-04-17' ORDER BY seq",
        "SELECT seq FROM events WHERE ratio > 400 ORDER BY seq",
        "SELECT seq, CAST(price AS TEXT) FROM events WHERE price > 2000 ORDER BY seq",
        "SELECT count(*), sum(amount) FROM events WHERE amount IS NOT NULL AND amount < 1500",
        "SELECT seq FROM events WHERE 2500 <= seq AND memo IS NOT NULL AND amount <> 1250 ORDER BY seq",
    ] {
        t.same(sql, "value predicates").await;
    }
    // February is in a segment: its row groups whose statistics exclude the predicate are
    // not fetched (tenant 2's buckets hold edits, so theirs are read whole).
    let pruned_sql =
        "SELECT count(*) FROM events WHERE at < '2021-03-01T00:00:00Z' AND mid > 9000000000000000";
    t.same(pruned_sql, "segment pruned by a value predicate")
        .await;
    let analyzed = t
        .ours(&format!("EXPLAIN ANALYZE {pruned_sql}"))
        .await
        .unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&analyzed)
        .unwrap()
        .to_string();
    let pruned: u64 = text
        .split("archived_row_groups_pruned=")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .unwrap_or(0);
    assert!(pruned >= 2, "{text}");
    let plan = t
        .ours("EXPLAIN SELECT seq FROM events WHERE mid >= 3000000")
        .await
        .unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&plan)
        .unwrap()
        .to_string();
    assert!(
        text.contains("archive_value_filters=[mid >= 3000000]"),
        "{text}"
    );

    // DuckDB reads an archived payload of the newest schema by column name, with the
    // values SQL gives (March 4's buckets: written after the changes, no masks since).
    duckdb_reads_by_name(&t).await;

    // Refusals, each naming what was wrong; nothing is stored.
    for (sql, needle) in [
        (
            "ALTER TABLE events ALTER COLUMN mid TYPE INTEGER",
            "does not widen",
        ),
        (
            "ALTER TABLE events ADD COLUMN strict TEXT NOT NULL",
            "DEFAULT",
        ),
        ("ALTER TABLE events DROP COLUMN seq", "key column"),
        ("ALTER TABLE events ADD COLUMN kind TEXT", "named twice"),
        (
            "ALTER TABLE events ADD COLUMN w INTERVAL",
            "unsupported type",
        ),
        (
            "ALTER TABLE events ADD COLUMN n INT DEFAULT now()",
            "constant",
        ),
        ("ALTER TABLE chat_nope ADD COLUMN x INT", "not registered"),
    ] {
        let e = t.ours(sql).await.unwrap_err();
        assert!(e.contains(needle), "{sql}: {e}");
    }
    for (sql, needle) in [
        ("INSERT INTO events (tenant_id, at, seq, kind, payload) VALUES (9, TIMESTAMPTZ '2021-03-05T00:00:00Z', 1, 'k', '{oops')", "column payload"),
        // A NOT NULL column left out is named.
        ("INSERT INTO events (tenant_id, at, seq) VALUES (9, TIMESTAMPTZ '2021-03-05T00:00:00Z', 1)", "column kind: must not be NULL"),
        ("INSERT INTO events (tenant_id, at, seq, kind) VALUES (9, TIMESTAMPTZ '2021-03-05T00:00:00Z', 1, NULL)", "column kind: must not be NULL"),
        ("UPDATE events SET tenant_id = 5 WHERE seq = 1001", "may not set tenant_id"),
        ("UPDATE events SET kind = NULL WHERE tenant_id = 2", "column kind: must not be NULL"),
    ] {
        let e = t.ours(sql).await.unwrap_err();
        assert!(e.contains(needle), "{sql}: {e}");
    }
    t.same(ALL_V2, "after the refusals").await;

    // Another session sees the newest schema (built afresh, and a running one within the
    // recheck interval).
    let other = session(
        t.store.clone(),
        t.archive.clone(),
        SessionOptions::default(),
    )
    .await
    .unwrap();
    t.both("ALTER TABLE events ADD COLUMN score INTEGER").await;
    tokio::time::sleep(pulpitum::provider::factory::SCHEMA_RECHECK).await;
    let df = other
        .sql("SELECT count(score), count(*) FROM events")
        .await
        .unwrap();
    let b = df.collect().await.unwrap();
    assert_eq!(b[0].column(0).as_primitive::<Int64Type>().value(0), 0);
}

/// The keys of the `events` table's archived objects whose key holds `part` and ends with
/// `suffix`.
async fn archived(t: &Both, part: &str, suffix: &str) -> Vec<String> {
    t.archive
        .list_objects()
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .filter(|k| k.contains("/v4/events/") && k.contains(part) && k.ends_with(suffix))
        .collect()
}

/// March 3's JSON payloads (record schema 3) read as plain JSON: each line's `value` names
/// the columns of the newest schema, typed; a JSON column is embedded as a document.
async fn json_reads_by_name(t: &Both) {
    let keys = archived(t, "day:2021-03-03", "payload.json").await;
    assert!(!keys.is_empty(), "March 3 was archived in JSON");
    let (mut lines, mut residual) = (0, 0);
    for k in &keys {
        let bytes = t.archive.operator().read(k).await.unwrap().to_bytes();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        let mut it = text.lines();
        let header: serde_json::Value = serde_json::from_str(it.next().unwrap()).unwrap();
        assert_eq!(header["schema_version"], 3, "{header}");
        let names: Vec<&str> = header["columns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert!(
            names.contains(&"memo") && !names.contains(&"flag"),
            "{names:?}"
        );
        for line in it {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let value = v["value"].as_object().unwrap();
            assert_eq!(value.len(), names.len(), "{line}");
            assert!(value["kind"].is_string(), "{line}");
            assert!(value["mid"].is_i64() || value["mid"].is_null(), "{line}");
            if value["kind"] != "odd" {
                assert!(value["payload"].is_object(), "{line}");
            }
            // Rows written under v1 and not updated since keep `flag` (dropped) and an
            // absent `region` in their residual.
            residual += usize::from(v["residual"].is_string());
            lines += 1;
        }
    }
    assert!(
        lines > 10 && residual > 0,
        "{lines} lines, {residual} with a residual"
    );
}

/// Every per-bucket Parquet payload of March 4 read by DuckDB (`read_parquet`, columns by
/// name, the sort key decoded from its 8-byte form) against the same rows through SQL.
async fn duckdb_reads_by_name(t: &Both) {
    let keys = archived(t, "day:2021-03-04", "payload.parquet").await;
    assert!(!keys.is_empty(), "March 4 was archived in Parquet");
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let bytes = t.archive.operator().read(k).await.unwrap().to_bytes();
        let f = dir.path().join(format!("p{i}.parquet"));
        std::fs::write(&f, &bytes).unwrap();
        files.push(f.display().to_string());
    }
    let script = r#"
import duckdb, json, sys
con = duckdb.connect()
out = []
for f in sys.argv[1:]:
    for sk, kind, memo, region, mid in con.execute(
        "SELECT sort_key, kind, memo, region, mid FROM read_parquet(?) ORDER BY event_time, sort_key", [f]
    ).fetchall():
        seq = int.from_bytes(sk, 'big') ^ (1 << 63)
        seq = seq - (1 << 64) if seq >= (1 << 63) else seq
        out.append([seq, kind, memo, region, mid])
print(json.dumps(sorted(out)))
"#;
    let run = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(&files)
        .output()
        .expect("python3 runs");
    assert!(
        run.status.success(),
        "duckdb (scripts/clients-up.sh installs it): {}",
        String::from_utf8_lossy(&run.stderr)
    );
    type Row = (i64, String, Option<String>, String, Option<i64>);
    let duck: Vec<Row> = serde_json::from_slice(&run.stdout).unwrap();
    let ours = arrow_cells(
        &t.ours("SELECT seq, kind, memo, region, mid FROM events WHERE at >= '2021-03-04T00:00:00Z' AND at < '2021-03-05T00:00:00Z' ORDER BY seq")
            .await
            .unwrap(),
    );
    let duck: Vec<Vec<Cell>> = duck
        .into_iter()
        .map(|(seq, kind, memo, region, mid)| {
            vec![
                Cell::Int(seq),
                Cell::Text(kind),
                memo.map_or(Cell::Null, Cell::Text),
                Cell::Text(region),
                mid.map_or(Cell::Null, Cell::Int),
            ]
        })
        .collect();
    assert!(!duck.is_empty());
    assert_eq!(duck, ours, "DuckDB's columns by name against SQL's");

    // Segments are columnar too: February's, compacted under schema version 1, name its
    // columns as they were then.
    let segments = archived(t, "/segments/", ".parquet").await;
    assert!(!segments.is_empty(), "February was compacted");
    let f = dir.path().join("segment.parquet");
    let bytes = t
        .archive
        .operator()
        .read(&segments[0])
        .await
        .unwrap()
        .to_bytes();
    std::fs::write(&f, &bytes).unwrap();
    let run = std::process::Command::new("python3")
        .arg("-c")
        .arg("import duckdb, sys; c = duckdb.connect(); r = c.execute('SELECT * FROM read_parquet(?) LIMIT 0', [sys.argv[1]]); print(','.join(d[0] for d in r.description))")
        .arg(f.display().to_string())
        .output()
        .unwrap();
    let names = String::from_utf8_lossy(&run.stdout).trim().to_string();
    assert_eq!(
        names,
        "partition_key,event_time,sort_key,kind,amount,note,flag,small,mid,price,blob,day,seen,payload,ratio,__pulpitum_residual",
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    // A JSON column carries Parquet's JSON logical type: DuckDB reads it as JSON documents.
    let run = std::process::Command::new("python3")
        .arg("-c")
        .arg("import duckdb, sys; c = duckdb.connect(); print(c.execute(\"SELECT column_type FROM (DESCRIBE SELECT payload FROM read_parquet(?))\", [sys.argv[1]]).fetchone()[0])")
        .arg(f.display().to_string())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&run.stdout).trim(),
        "JSON",
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_table_matches_postgresql_across_tiers_and_schema_changes() {
    declared(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_table_matches_postgresql_on_the_embedded_store() {
    declared(true).await;
}

/// Changes made from the same version: the registry keeps one and refuses the other
/// with nothing stored; under racing sessions no change is lost or applied twice (every
/// change that succeeded is in the newest schema, every refused one is not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_schema_changes_are_serialized_by_version() {
    let t = Both::new("decl_race", false).await;
    t.ours(CREATE).await.unwrap();
    let id = pulpitum::model::TableId::new("events").unwrap();
    let v1 = t.store.table_schema(&id).await.unwrap().unwrap();
    let schema = pulpitum::model::schema::TableSchema::from_json(&v1.definition).unwrap();
    let add = |name: &str| {
        let s = schema
            .apply(&pulpitum::model::schema::SchemaChange::AddColumn {
                name: name.into(),
                ty: pulpitum::model::schema::ColumnType::Text,
                nullable: true,
                default: None,
            })
            .unwrap();
        pulpitum::store::StoredSchema {
            version: s.version,
            definition: s.to_json(),
        }
    };
    t.store.put_table_schema(&id, &add("a")).await.unwrap();
    // The same version again is a no-op; another definition of it is refused.
    t.store.put_table_schema(&id, &add("a")).await.unwrap();
    let e = t.store.put_table_schema(&id, &add("b")).await.unwrap_err();
    assert!(e.to_string().contains("schema changed"), "{e}");
    // Version 4 does not follow version 2.
    let mut skip = add("c");
    skip.version = 4;
    assert!(t.store.put_table_schema(&id, &skip).await.is_err());

    // Racing sessions, each adding its own column.
    let mut tasks = Vec::new();
    for i in 0..8 {
        let ctx = session(
            t.store.clone(),
            t.archive.clone(),
            SessionOptions::default(),
        )
        .await
        .unwrap();
        tasks.push(tokio::spawn(async move {
            let sql = format!("ALTER TABLE events ADD COLUMN c{i} TEXT");
            match pulpitum::control::sql(&ctx, &sql).await {
                Ok(df) => df.collect().await.map(|_| i).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            }
        }));
    }
    let mut won = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            Ok(i) => won.push(format!("c{i}")),
            Err(e) => assert!(e.contains("schema changed"), "{e}"),
        }
    }
    assert!(!won.is_empty());
    let newest = t.store.table_schema(&id).await.unwrap().unwrap();
    let newest = pulpitum::model::schema::TableSchema::from_json(&newest.definition).unwrap();
    assert_eq!(newest.version as usize, 2 + won.len());
    let mut added: Vec<String> = newest
        .columns
        .iter()
        .map(|c| c.name.clone())
        .filter(|n| n.starts_with('c') && n.len() == 2)
        .collect();
    added.sort();
    won.sort();
    assert_eq!(added, won);
}

/// What an adversarial review found, each fixed: a non-finite DEFAULT is stored and read
/// back (it made every session fail to start); an UPDATE from a session planned before a
/// column was added is refused once and then keeps that column's value (it was erased); a
/// start-up script's CREATE ... IF NOT EXISTS after changes is a no-op; an integer DEFAULT
/// follows its column to DOUBLE PRECISION; a DEFAULT cast to another type is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_sessions_and_constants() {
    let t = Both::new("decl_stale", false).await;
    t.ours(CREATE).await.unwrap();
    t.ours("ALTER TABLE events ADD COLUMN x DOUBLE PRECISION DEFAULT 'NaN'")
        .await
        .unwrap();
    t.ours("ALTER TABLE events ADD COLUMN n INTEGER NOT NULL DEFAULT 5")
        .await
        .unwrap();
    t.ours("ALTER TABLE events ALTER COLUMN n TYPE DOUBLE PRECISION")
        .await
        .unwrap();
    let e = t
        .ours("ALTER TABLE events ADD COLUMN m DOUBLE PRECISION DEFAULT 1.9::integer")
        .await
        .unwrap_err();
    assert!(e.contains("cast to INTEGER"), "{e}");
    let create_again = CREATE.replace(
        "CREATE EXTERNAL TABLE events",
        "CREATE EXTERNAL TABLE IF NOT EXISTS events",
    );
    t.ours(&create_again).await.unwrap();
    assert!(t
        .ours(CREATE)
        .await
        .unwrap_err()
        .contains("exists with another schema"));

    // A second session, built now, and a row.
    let other = session(
        t.store.clone(),
        t.archive.clone(),
        SessionOptions::default(),
    )
    .await
    .unwrap();
    let run_other = |sql: &'static str| {
        let other = other.clone();
        async move {
            match pulpitum::control::sql(&other, sql).await {
                Ok(df) => df.collect().await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            }
        }
    };
    run_other("INSERT INTO events (tenant_id, at, seq, kind) VALUES (1, TIMESTAMPTZ '2021-03-01T00:00:00Z', 1, 'k')")
        .await
        .unwrap();
    // The first session adds a column and fills it; the second, within its recheck
    // interval, updates another column of the row.
    t.ours("ALTER TABLE events ADD COLUMN b TEXT")
        .await
        .unwrap();
    t.ours("UPDATE events SET b = 'important' WHERE seq = 1")
        .await
        .unwrap();
    let e = run_other("UPDATE events SET amount = 6 WHERE seq = 1")
        .await
        .unwrap_err();
    assert!(e.contains("schema changed"), "{e}");
    run_other("UPDATE events SET amount = 6 WHERE seq = 1")
        .await
        .unwrap();
    let b = t
        .ours("SELECT b, amount, n, isnan(x) FROM events WHERE seq = 1")
        .await
        .unwrap();
    assert_eq!(
        arrow_cells(&b),
        vec![vec![
            Cell::Text("important".into()),
            Cell::Float(6.0),
            Cell::Float(5.0),
            Cell::Bool(true)
        ]]
    );
    // A new session starts and reads the table (a NaN default made every start fail).
    let fresh = session(
        t.store.clone(),
        t.archive.clone(),
        SessionOptions::default(),
    )
    .await
    .unwrap();
    let n = fresh
        .sql("SELECT count(*) FROM events")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(n[0].column(0).as_primitive::<Int64Type>().value(0), 1);
}

/// `DEFAULT` as a whole value of `INSERT ... VALUES` rows, against PostgreSQL given the
/// same table: every column type's default, with and without a column list, several rows
/// asking for the same columns, a column without a default (NULL). Rows that ask for
/// different columns, a `DEFAULT` inside an expression and rows of nothing but `DEFAULT`
/// are refused with a message saying which, and write nothing; a quoted `"default"` stays
/// a column reference. The prepared path (parameters beside `DEFAULT`) gives the same row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_values_in_insert_rows_match_postgresql() {
    let t = Both::new("decl_dflt", true).await;
    let columns = "k BIGINT NOT NULL, at TIMESTAMPTZ NOT NULL, s BIGINT NOT NULL, \
        note TEXT DEFAULT 'none', n INTEGER, p NUMERIC(12, 2) DEFAULT 3.10, \
        d DATE DEFAULT '2026-01-02', f DOUBLE PRECISION DEFAULT 'NaN', \
        ts TIMESTAMPTZ DEFAULT '2026-05-06T07:08:09Z', ok BOOLEAN DEFAULT true, \
        j JSON DEFAULT '{\"a\": 1}', b BYTEA";
    t.ours(&format!(
        "CREATE EXTERNAL TABLE ev ({columns}) STORED AS PULPITUM LOCATION '' \
         OPTIONS ('partition_by' 'k', 'time' 'at', 'order_by' 's', \
         'bucket_strategy' 'calendar_day_utc')"
    ))
    .await
    .unwrap();
    t.pg.batch_execute(&format!("CREATE TABLE ev ({columns})"))
        .await
        .unwrap();
    for sql in [
        "INSERT INTO ev VALUES (1, TIMESTAMPTZ '2026-11-01T10:00:00Z', 1, DEFAULT, 3, \
         DEFAULT, default, DEFAULT, Default, DEFAULT, DEFAULT, DEFAULT)",
        "INSERT INTO ev (k, at, s, n, note, ok) VALUES \
         (1, TIMESTAMPTZ '2026-11-01T10:00:00Z', 2, DEFAULT, 'x', DEFAULT), \
         (2, TIMESTAMPTZ '2026-11-02T10:00:00Z', 3, DEFAULT, 'y', DEFAULT)",
        "INSERT INTO ev (s, k, at, p, ok) VALUES \
         (4, 3, TIMESTAMPTZ '2026-11-03T10:00:00Z', DEFAULT, false)",
    ] {
        t.both(sql).await;
    }
    let all = "SELECT k, at, s, note, n, CAST(p AS TEXT), d, CAST(f AS TEXT), ts, ok, CAST(j AS TEXT), b \
        FROM ev ORDER BY s";
    assert_eq!(t.same(all, "DEFAULT in VALUES").await, 4);

    for (sql, says) in [
        (
            "INSERT INTO ev (k, at, s, note) VALUES (9, TIMESTAMPTZ '2026-11-01T00:00:00Z', 9, \
             DEFAULT), (9, TIMESTAMPTZ '2026-11-01T00:00:00Z', 10, 'z')",
            "same columns of every row of one INSERT (row 2 differs)",
        ),
        (
            "INSERT INTO ev (k, at, s, n) VALUES (9, TIMESTAMPTZ '2026-11-01T00:00:00Z', 9, \
             DEFAULT + 1)",
            "not inside an expression",
        ),
        (
            "INSERT INTO ev (k, at, s) VALUES (DEFAULT, DEFAULT, DEFAULT)",
            "every value of the INSERT is DEFAULT",
        ),
        (
            "INSERT INTO ev (k, at, s, note) VALUES (9, TIMESTAMPTZ '2026-11-01T00:00:00Z', 9, \
             \"default\")",
            "default",
        ),
        (
            "INSERT INTO ev (k, at, s, n) VALUES (9, TIMESTAMPTZ '2026-11-01T00:00:00Z', 9, \
             coalesce(DEFAULT, 1))",
            "not inside an expression",
        ),
        // The break-it review's: a repeated or unknown column beside DEFAULT was dropped
        // unchecked and the row written; and removing a column renumbered `column4` and
        // positions in ORDER BY, keeping another row than the one meant.
        (
            "INSERT INTO ev (k, at, s, note, note) VALUES \
             (9, TIMESTAMPTZ '2026-11-01T00:00:00Z', 9, 'dup', DEFAULT)",
            "column \"note\" specified more than once",
        ),
        (
            "INSERT INTO ev (k, at, s, N, n) VALUES \
             (9, TIMESTAMPTZ '2026-11-01T00:00:00Z', 9, DEFAULT, 5)",
            "column \"n\" specified more than once",
        ),
        (
            "INSERT INTO ev (k, at, s, bogus) VALUES (9, TIMESTAMPTZ '2026-11-01T00:00:00Z', 9, \
             DEFAULT)",
            "column \"bogus\" of relation \"ev\" does not exist",
        ),
        (
            "INSERT INTO ev (k, at, s, x.y) VALUES (9, TIMESTAMPTZ '2026-11-01T00:00:00Z', 9, \
             DEFAULT)",
            "must be a plain column name",
        ),
        (
            "INSERT INTO ev (note, k, at, s, n) VALUES \
             (DEFAULT, 9, TIMESTAMPTZ '2026-11-01T00:00:00Z', 9, 20), \
             (DEFAULT, 9, TIMESTAMPTZ '2026-11-01T00:00:00Z', 10, 10) ORDER BY column4 LIMIT 1",
            "not with WITH, ORDER BY, LIMIT, OFFSET or FETCH",
        ),
        (
            "INSERT INTO ev (k, at, s, note) VALUES \
             (9, TIMESTAMPTZ '2026-11-01T00:00:00Z', 9, DEFAULT), (9, TIMESTAMPTZ '2026-11-01T00:00:00Z', 10)",
            "VALUES lists must all be the same length",
        ),
    ] {
        let e = t.ours(sql).await.unwrap_err();
        assert!(e.contains(says), "{sql}: {e}");
    }
    assert_eq!(t.same(all, "after the refusals").await, 4);
    // EXPLAIN of such an INSERT plans the rewritten statement (and writes nothing).
    let plan = t
        .ours(
            "EXPLAIN INSERT INTO ev (k, at, s, note) VALUES \
             (9, TIMESTAMPTZ '2026-11-01T00:00:00Z', 9, DEFAULT)",
        )
        .await
        .unwrap();
    assert!(!plan.is_empty());
    assert_eq!(t.same(all, "after EXPLAIN").await, 4);

    let prepared = pulpitum::prepared::prepare(
        &t.ctx,
        "INSERT INTO ev (k, at, s, note, p) VALUES ($1, TIMESTAMPTZ '2026-11-04T10:00:00Z', $2, \
         DEFAULT, $3)",
    )
    .await
    .unwrap();
    prepared
        .execute(&[
            datafusion::common::ScalarValue::Int64(Some(4)),
            datafusion::common::ScalarValue::Int64(Some(5)),
            datafusion::common::ScalarValue::Decimal128(Some(725), 12, 2),
        ])
        .await
        .unwrap();
    t.pg.batch_execute(
        "INSERT INTO ev (k, at, s, note, p) VALUES (4, TIMESTAMPTZ '2026-11-04T10:00:00Z', 5, \
         DEFAULT, 7.25)",
    )
    .await
    .unwrap();
    assert_eq!(t.same(all, "prepared").await, 5);
}
