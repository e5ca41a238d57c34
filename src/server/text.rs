//! Timestamps sent as text, formatted a column at a time.
//!
//! A client on the text format (psql, most BI tools, the simple protocol of every driver)
//! receives each `timestamptz` as a string. pgwire writes one with chrono's
//! `format(pattern)`, which parses the pattern again for every value, after arrow-pg has
//! parsed the column's time zone name again for every value; on the ad-hoc latest-50 page
//! that was about a sixth of the server's CPU. [`timestamps_as_text`] formats such a
//! column before the row encoder sees it: the zone and the pattern are parsed once per
//! batch, and each value goes through the same chrono formatting with the same items, so
//! the bytes on the wire are the ones pgwire would have written (a test compares them
//! over zones with fractional offsets, dates before 1970 and far ahead, and NULLs). The
//! column then reaches the encoder as text, which it writes as is; the column's type, as
//! the client was told it, stays `timestamptz`.
//!
//! Anything else (binary results, other types and units, a zone chrono-tz does not know)
//! is left to the encoder unchanged. The pattern is the one pgwire derives from the field's
//! date style; the fields the server builds carry the default (ISO), whatever the session
//! set (an older gap, noted on issue 25).

use std::fmt::Write;
use std::str::FromStr;
use std::sync::Arc;

use chrono::format::{Item, StrftimeItems};
use datafusion::arrow::array::timezone::Tz;
use datafusion::arrow::array::{Array, ArrayRef, StringBuilder, TimestampMicrosecondArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion_postgres::pgwire::api::results::{FieldFormat, FieldInfo};
use datafusion_postgres::pgwire::api::Type;
use datafusion_postgres::pgwire::types::format::date_style::DateStyle;

/// `batch` with each microsecond `timestamptz` column that `fields` sends as text replaced
/// by its text, as pgwire would write it; the batch itself when there is none.
pub(super) fn timestamps_as_text(batch: RecordBatch, fields: &[FieldInfo]) -> RecordBatch {
    if fields.len() != batch.num_columns() {
        return batch;
    }
    let schema = batch.schema();
    let mut columns: Option<(Vec<ArrayRef>, Vec<Arc<Field>>)> = None;
    for (i, (field, pg)) in schema.fields().iter().zip(fields).enumerate() {
        let DataType::Timestamp(TimeUnit::Microsecond, Some(zone)) = field.data_type() else {
            continue;
        };
        if pg.format() != FieldFormat::Text || *pg.datatype() != Type::TIMESTAMPTZ {
            continue;
        }
        let Some(text) = column_text(batch.column(i).as_ref(), zone, pg) else {
            continue;
        };
        let (arrays, out_fields) = columns.get_or_insert_with(|| {
            (
                batch.columns().to_vec(),
                schema.fields().iter().cloned().collect(),
            )
        });
        arrays[i] = text;
        out_fields[i] = Arc::new(Field::new(field.name(), DataType::Utf8, true));
    }
    let Some((arrays, out_fields)) = columns else {
        return batch;
    };
    // Same rows, same number of columns: only the types of some changed.
    RecordBatch::try_new(Arc::new(Schema::new(out_fields)), arrays).unwrap_or(batch)
}

/// One column's values as pgwire's text format writes them; `None` to leave the column to
/// the encoder (a zone chrono-tz does not know is refused there, as before).
fn column_text(array: &dyn Array, zone: &str, pg: &FieldInfo) -> Option<ArrayRef> {
    let values = array.as_any().downcast_ref::<TimestampMicrosecondArray>()?;
    let tz = Tz::from_str(zone).ok()?;
    // The pattern pgwire takes for this field's date style, parsed once.
    let pattern = DateStyle::new(&pg.format_options().date_style).full_tz_format_smolstr();
    let items: Vec<Item<'_>> = StrftimeItems::new(&pattern).parse().ok()?;
    let mut out = StringBuilder::with_capacity(values.len(), values.len() * 32);
    for i in 0..values.len() {
        if values.is_null(i) {
            out.append_null();
            continue;
        }
        // As arrow-pg does: the instant in the column's zone, with its offset fixed; an
        // instant chrono cannot represent is sent as NULL there too.
        match values
            .value_as_datetime_with_tz(i, tz)
            .map(|d| d.fixed_offset())
        {
            Some(d) => {
                write!(out, "{}", d.format_with_items(items.iter())).ok()?;
                out.append_value("");
            }
            None => out.append_null(),
        }
    }
    Some(Arc::new(out.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion_postgres::arrow_pg::datatypes::{arrow_schema_to_pg_fields, encode_recordbatch};
    use datafusion_postgres::pgwire::api::portal::Format;
    use datafusion_postgres::pgwire::messages::data::DataRow;

    fn rows(batch: RecordBatch, fields: &Arc<Vec<FieldInfo>>) -> Vec<DataRow> {
        encode_recordbatch(fields.clone(), batch)
            .collect::<Result<Vec<_>, _>>()
            .unwrap()
    }

    /// The rows on the wire are byte for byte those pgwire writes from the timestamps
    /// themselves, in every zone shape (whole, half and quarter hours, west and east, with
    /// and without summer time), before 1970, far ahead, and with NULLs.
    #[test]
    fn text_timestamps_are_the_bytes_pgwire_writes() {
        let micros: Vec<Option<i64>> = vec![
            Some(0),
            Some(1),
            Some(-1),
            Some(1_767_225_600_000_000),
            Some(1_767_225_600_123_456),
            Some(-2_208_988_800_000_000),
            Some(-62_135_596_800_000_000),
            Some(253_402_300_799_999_999),
            Some(1_720_000_000_500_000),
            None,
            Some(951_782_400_000_000),
        ];
        for zone in [
            "+00:00",
            "UTC",
            "Asia/Kolkata",
            "America/St_Johns",
            "Asia/Kathmandu",
            "America/New_York",
            "Europe/Berlin",
            "Australia/Lord_Howe",
            "-03:30",
        ] {
            let ts = TimestampMicrosecondArray::from(micros.clone()).with_timezone(zone);
            let ids = Int64Array::from((0..micros.len() as i64).collect::<Vec<_>>());
            let schema = Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("at", ts.data_type().clone(), true),
            ]));
            let batch =
                RecordBatch::try_new(schema.clone(), vec![Arc::new(ids), Arc::new(ts)]).unwrap();
            let fields =
                Arc::new(arrow_schema_to_pg_fields(&schema, &Format::UnifiedText, None).unwrap());
            let converted = timestamps_as_text(batch.clone(), &fields);
            assert_eq!(
                converted.schema().field(1).data_type(),
                &DataType::Utf8,
                "{zone}: the column was formatted here"
            );
            assert_eq!(rows(converted, &fields), rows(batch, &fields), "{zone}");
        }
    }

    /// Binary results, and columns that are not `timestamptz` with a zone, are untouched.
    #[test]
    fn other_columns_and_formats_are_left_to_the_encoder() {
        let ts = TimestampMicrosecondArray::from(vec![Some(0)]).with_timezone("UTC");
        let naive = TimestampMicrosecondArray::from(vec![Some(0)]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("at", ts.data_type().clone(), true),
            Field::new("naive", naive.data_type().clone(), true),
        ]));
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(ts), Arc::new(naive)]).unwrap();
        let binary =
            Arc::new(arrow_schema_to_pg_fields(&schema, &Format::UnifiedBinary, None).unwrap());
        assert_eq!(timestamps_as_text(batch.clone(), &binary).schema(), schema);
        let text =
            Arc::new(arrow_schema_to_pg_fields(&schema, &Format::UnifiedText, None).unwrap());
        let converted = timestamps_as_text(batch, &text);
        assert_eq!(converted.schema().field(0).data_type(), &DataType::Utf8);
        assert_eq!(
            converted.schema().field(1).data_type(),
            &DataType::Timestamp(TimeUnit::Microsecond, None)
        );
    }
}
