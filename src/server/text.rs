//! Timestamps sent as text: in the session's time zone, with PostgreSQL's offsets,
//! formatted a column at a time.
//!
//! A client on the text format (psql, most BI tools, the simple protocol of every driver)
//! receives each `timestamptz` as a string. Left to pgwire, that string had two faults and a
//! cost. The ISO offset was written with chrono's `%:::z`, hours only, so an instant in
//! Asia/Kolkata came out as `05:30:00+05`: thirty minutes from the truth. The zone was the
//! column's own (UTC for every stored column), where PostgreSQL writes every `timestamptz`
//! in the session's `TimeZone`. And chrono parsed the strftime pattern again for every value,
//! after arrow-pg had parsed the zone name again for every value: about a sixth of the
//! server's CPU on the ad-hoc latest-50 page.
//!
//! [`timestamps_as_text`] formats such a column before the row encoder sees it, which then
//! writes the text as is (the column's type, as the client was told it, stays
//! `timestamptz`). The zone and the pattern are parsed once per batch. The date and time are
//! written with the pattern of the field's date style, as pgwire would; in the ISO style the
//! offset follows PostgreSQL's rule: hours, then minutes only when they are not zero, then
//! seconds only when they are not zero (`+00`, `+05:30`, `-03:30`, `+00:19:32` for a
//! local mean time). The other date styles keep pgwire's `+05:30` form. In every style the
//! fractional seconds are PostgreSQL's: pgwire writes six digits always
//! (`00:00:00.000000`), PostgreSQL only up to the last digit that is not zero
//! (`00:00:00`, `00:00:00.5`). A `timestamp` without a zone is written here for that alone.
//!
//! Binary results carry the instant alone and are left to the encoder, as is anything a zone
//! cannot be found for.

use std::fmt::Write;
use std::str::FromStr;
use std::sync::Arc;

use chrono::format::{Item, StrftimeItems};
use chrono::{DateTime, Offset, Timelike};
use datafusion::arrow::array::timezone::Tz;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringBuilder};
use datafusion::arrow::datatypes::{
    ArrowTemporalType, DataType, Field, Schema, TimeUnit, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType,
};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::prelude::SessionContext;
use datafusion_postgres::pgwire::api::results::{FieldFormat, FieldInfo};
use datafusion_postgres::pgwire::api::Type;
use datafusion_postgres::pgwire::types::format::date_style::DateStyle;
use datafusion_postgres::pgwire::types::format::FormatOptions;

/// How a session wants its values written as text: pgwire's format options (date style,
/// interval style, bytea output, float digits), read from what the client set, and the time
/// zone every `timestamptz` is written in.
#[derive(Clone, Debug)]
pub(super) struct TextStyle {
    pub(super) options: Arc<FormatOptions>,
    /// The session's `TimeZone`; `None` when it has none set (each column's own zone).
    zone: Option<Tz>,
}

impl TextStyle {
    /// The style of a session whose client set `metadata` and whose configuration is `ctx`'s.
    pub(super) fn of(
        metadata: &std::collections::HashMap<String, String>,
        ctx: &SessionContext,
    ) -> Self {
        let zone = session_zone(ctx, |z| z.and_then(|z| Tz::from_str(z).ok()));
        Self {
            options: Arc::new(FormatOptions::from_client_metadata(metadata)),
            zone,
        }
    }
}

/// `read` of the session's time zone, `None` when it has none set. Read in place:
/// `SessionContext::state()` clones the whole session state (every function registry); on
/// the paths run at every execution of a prepared statement, those hash-map clones and their
/// allocations topped a profile of the wire bench.
pub(super) fn session_zone<T>(ctx: &SessionContext, read: impl FnOnce(Option<&str>) -> T) -> T {
    read(
        ctx.state_ref()
            .read()
            .config()
            .options()
            .execution
            .time_zone
            .as_deref(),
    )
}

/// `batch` with each `timestamptz` column that `fields` sends as text replaced by its text
/// (module doc); the batch itself when there is none.
pub(super) fn timestamps_as_text(
    batch: RecordBatch,
    fields: &[FieldInfo],
    style: &TextStyle,
) -> RecordBatch {
    if fields.len() != batch.num_columns() {
        return batch;
    }
    let schema = batch.schema();
    let mut columns: Option<(Vec<ArrayRef>, Vec<Arc<Field>>)> = None;
    for (i, (field, pg)) in schema.fields().iter().zip(fields).enumerate() {
        let DataType::Timestamp(_, own) = field.data_type() else {
            continue;
        };
        if pg.format() != FieldFormat::Text {
            continue;
        }
        // A `timestamptz` in the session's zone (or its own); a `timestamp` as it is.
        let zone = match (own, pg.datatype()) {
            (Some(own), &Type::TIMESTAMPTZ) => {
                match style.zone.or_else(|| Tz::from_str(own).ok()) {
                    Some(zone) => Some(zone),
                    None => continue,
                }
            }
            (None, &Type::TIMESTAMP) => None,
            _ => continue,
        };
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

/// One column's values as text, in `zone` for a `timestamptz` (`None`: a `timestamp`);
/// `None` to leave the column to the encoder.
fn column_text(array: &dyn Array, zone: Option<Tz>, pg: &FieldInfo) -> Option<ArrayRef> {
    match array.data_type() {
        DataType::Timestamp(TimeUnit::Second, _) => {
            unit_text::<TimestampSecondType>(array, zone, pg)
        }
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            unit_text::<TimestampMillisecondType>(array, zone, pg)
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            unit_text::<TimestampMicrosecondType>(array, zone, pg)
        }
        DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            unit_text::<TimestampNanosecondType>(array, zone, pg)
        }
        _ => None,
    }
}

/// The suffix pgwire gives the ISO pattern: chrono's hours-only offset.
const HOURS_ONLY_OFFSET: &str = "%:::z";

/// Where every date style of pgwire writes six fractional digits, always.
const SIX_DIGITS: &str = "%.6f";

fn unit_text<T: ArrowTemporalType>(
    array: &dyn Array,
    zone: Option<Tz>,
    pg: &FieldInfo,
) -> Option<ArrayRef>
where
    i64: From<T::Native>,
{
    let values = array.as_primitive_opt::<T>()?;
    // The pattern pgwire takes for this field's date style, parsed once; in the ISO style
    // the offset is written here instead, PostgreSQL's way, and in every style the
    // fractional seconds are (see `write_fraction`).
    let style = DateStyle::new(&pg.format_options().date_style);
    let pattern = match zone {
        Some(_) => style.full_tz_format_smolstr(),
        None => style.full_format_str().into(),
    };
    let (pattern, pg_offset) = match pattern.strip_suffix(HOURS_ONLY_OFFSET) {
        Some(rest) => (rest, true),
        None => (pattern.as_str(), false),
    };
    let (head, tail) = pattern.split_once(SIX_DIGITS)?;
    let head: Vec<Item<'_>> = StrftimeItems::new(head).parse().ok()?;
    let tail: Vec<Item<'_>> = StrftimeItems::new(tail).parse().ok()?;
    let mut out = StringBuilder::with_capacity(values.len(), values.len() * 32);
    for i in 0..values.len() {
        if values.is_null(i) {
            out.append_null();
            continue;
        }
        // An instant chrono cannot represent is sent as NULL, as arrow-pg does.
        let written = match zone {
            Some(zone) => values.value_as_datetime_with_tz(i, zone).map(|d| {
                let d = d.fixed_offset();
                write!(out, "{}", d.format_with_items(head.iter()))?;
                write_fraction(&mut out, d.nanosecond())?;
                write!(out, "{}", d.format_with_items(tail.iter()))?;
                if pg_offset {
                    write_offset(&mut out, &d)?;
                }
                Ok(())
            }),
            None => values.value_as_datetime(i).map(|d| {
                write!(out, "{}", d.format_with_items(head.iter()))?;
                write_fraction(&mut out, d.nanosecond())?;
                write!(out, "{}", d.format_with_items(tail.iter()))
            }),
        };
        match written {
            Some(r) => {
                r.ok()?;
                out.append_value("");
            }
            None => out.append_null(),
        }
    }
    Some(Arc::new(out.finish()))
}

/// Fractional seconds as PostgreSQL writes them: microseconds, without their trailing
/// zeros, and nothing at all for a whole second (`00:00:00`, `00:00:00.5`,
/// `00:00:00.123456`). Finer digits are cut, as pgwire cuts them.
fn write_fraction<W: Write>(out: &mut W, nanos: u32) -> std::fmt::Result {
    let micros = nanos / 1_000 % 1_000_000;
    if micros == 0 {
        return Ok(());
    }
    let digits = format!("{micros:06}");
    write!(out, ".{}", digits.trim_end_matches('0'))
}

/// PostgreSQL's ISO offset of `d`: `+HH`, `+HH:MM` when the minutes are not zero,
/// `+HH:MM:SS` when the seconds are not zero.
fn write_offset<W: Write>(out: &mut W, d: &DateTime<chrono::FixedOffset>) -> std::fmt::Result {
    let east = d.offset().fix().local_minus_utc();
    let sign = if east < 0 { '-' } else { '+' };
    let total = east.unsigned_abs();
    let (hours, minutes, seconds) = (total / 3600, total / 60 % 60, total % 60);
    write!(out, "{sign}{hours:02}")?;
    if seconds != 0 {
        write!(out, ":{minutes:02}:{seconds:02}")
    } else if minutes != 0 {
        write!(out, ":{minutes:02}")
    } else {
        Ok(())
    }
}

#[cfg(test)]
impl TextStyle {
    /// A style with `options` in `zone` (an IANA name or an offset; `None`: none set).
    fn with(options: FormatOptions, zone: Option<&str>) -> Self {
        Self {
            options: Arc::new(options),
            zone: zone.map(|z| Tz::from_str(z).expect("zone")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Duration, NaiveDateTime};
    use datafusion::arrow::array::TimestampNanosecondArray;
    use datafusion::arrow::array::{Int64Array, StringArray, TimestampMicrosecondArray};
    use datafusion_postgres::arrow_pg::datatypes::{arrow_schema_to_pg_fields, encode_recordbatch};
    use datafusion_postgres::pgwire::api::portal::Format;
    use datafusion_postgres::pgwire::messages::data::DataRow;

    const INSTANTS: [Option<i64>; 11] = [
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

    const ZONES: [&str; 9] = [
        "+00:00",
        "UTC",
        "Asia/Kolkata",
        "America/St_Johns",
        "Asia/Kathmandu",
        "America/New_York",
        "Europe/Berlin",
        "Australia/Lord_Howe",
        "-03:30",
    ];

    fn batch_of(ts: ArrayRef) -> RecordBatch {
        let ids = Int64Array::from((0..ts.len() as i64).collect::<Vec<_>>());
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("at", ts.data_type().clone(), true),
        ]));
        RecordBatch::try_new(schema, vec![Arc::new(ids), ts]).unwrap()
    }

    fn text_fields(batch: &RecordBatch, options: &FormatOptions) -> Arc<Vec<FieldInfo>> {
        Arc::new(
            arrow_schema_to_pg_fields(
                &batch.schema(),
                &Format::UnifiedText,
                Some(Arc::new(options.clone())),
            )
            .unwrap(),
        )
    }

    fn rows(batch: RecordBatch, fields: &Arc<Vec<FieldInfo>>) -> Vec<DataRow> {
        encode_recordbatch(fields.clone(), batch)
            .collect::<Result<Vec<_>, _>>()
            .unwrap()
    }

    /// Each row's values as the text it carries (`None`: NULL).
    fn row_texts(rows: &[DataRow]) -> Vec<Vec<Option<String>>> {
        rows.iter()
            .map(|r| {
                let mut at = 0;
                let mut out = Vec::new();
                while at < r.data.len() {
                    let n = i32::from_be_bytes(r.data[at..at + 4].try_into().unwrap());
                    at += 4;
                    if n < 0 {
                        out.push(None);
                        continue;
                    }
                    let end = at + n as usize;
                    out.push(Some(String::from_utf8(r.data[at..end].to_vec()).unwrap()));
                    at = end;
                }
                out
            })
            .collect()
    }

    /// pgwire's text with PostgreSQL's fractional seconds: trailing zeros cut, and the point
    /// with them when nothing is left.
    fn pg_fraction(text: &str) -> String {
        // The seconds' point, after the time of day's first colon (German dates have dots).
        let Some(dot) = text
            .find(':')
            .and_then(|colon| text[colon..].find('.').map(|d| colon + d))
        else {
            return text.to_string();
        };
        let digits = text[dot + 1..]
            .find(|c: char| !c.is_ascii_digit())
            .map_or(text.len(), |n| dot + 1 + n);
        let kept = text[dot + 1..digits].trim_end_matches('0');
        let point = if kept.is_empty() { "" } else { "." };
        format!("{}{point}{kept}{}", &text[..dot], &text[digits..])
    }

    /// pgwire's rows with PostgreSQL's fractional seconds in every text.
    fn pg_rows(batch: RecordBatch, fields: &Arc<Vec<FieldInfo>>) -> Vec<Vec<Option<String>>> {
        row_texts(&rows(batch, fields))
            .into_iter()
            .map(|r| r.into_iter().map(|v| v.map(|t| pg_fraction(&t))).collect())
            .collect()
    }

    /// The `at` column's text, per row.
    fn texts(ts: ArrayRef, options: FormatOptions, session: Option<&str>) -> Vec<Option<String>> {
        let batch = batch_of(ts);
        let fields = text_fields(&batch, &options);
        let out = timestamps_as_text(batch, &fields, &TextStyle::with(options, session));
        let column = out.column(1).as_any().downcast_ref::<StringArray>();
        let column = column.expect("the column was formatted here");
        column.iter().map(|v| v.map(str::to_string)).collect()
    }

    fn micros(zone: &str) -> ArrayRef {
        Arc::new(TimestampMicrosecondArray::from(INSTANTS.to_vec()).with_timezone(zone))
    }

    /// The ISO offsets and fractions are PostgreSQL's (what `SET TimeZone` then `SELECT
    /// ts::text` prints there): minutes and seconds of an offset are kept, not cut off, and
    /// fractional seconds are written only as far as their last digit that is not zero.
    #[test]
    fn iso_offsets_are_postgresqls() {
        let new_year = Some(1_767_225_600_000_000);
        let cases = [
            ("UTC", new_year, "2026-01-01 00:00:00+00"),
            ("Asia/Kolkata", new_year, "2026-01-01 05:30:00+05:30"),
            ("Asia/Kathmandu", new_year, "2026-01-01 05:45:00+05:45"),
            ("America/St_Johns", new_year, "2025-12-31 20:30:00-03:30"),
            ("America/New_York", new_year, "2025-12-31 19:00:00-05"),
            // Berlin kept its local mean time until 1893.
            (
                "Europe/Berlin",
                Some(-2_524_521_600_000_000),
                "1890-01-01 00:53:28+00:53:28",
            ),
            (
                "UTC",
                Some(1_767_225_600_500_000),
                "2026-01-01 00:00:00.5+00",
            ),
            (
                "UTC",
                Some(1_767_225_600_123_450),
                "2026-01-01 00:00:00.12345+00",
            ),
            (
                "UTC",
                Some(1_767_225_600_000_001),
                "2026-01-01 00:00:00.000001+00",
            ),
            ("UTC", Some(-1), "1969-12-31 23:59:59.999999+00"),
        ];
        for (zone, at, want) in cases {
            let ts = Arc::new(TimestampMicrosecondArray::from(vec![at]).with_timezone("UTC"));
            let got = texts(ts, FormatOptions::default(), Some(zone));
            assert_eq!(got, vec![Some(want.to_string())], "{zone}");
        }
    }

    /// Parses PostgreSQL's ISO text back into the instant it names.
    fn instant_of(text: &str) -> i64 {
        // The offset starts at the first sign after the time of day (years past 9999 take
        // five digits and a sign of their own).
        let time = text.rfind(' ').unwrap() + 1;
        let at = time + text[time..].find(['+', '-']).unwrap();
        let (local, offset) = text.split_at(at);
        let local = NaiveDateTime::parse_from_str(local, "%Y-%m-%d %H:%M:%S%.f").unwrap();
        let sign = if offset.starts_with('-') { -1 } else { 1 };
        let parts: Vec<i64> = offset[1..].split(':').map(|p| p.parse().unwrap()).collect();
        assert!((1..=3).contains(&parts.len()), "{text}");
        let east = parts
            .iter()
            .zip([3600, 60, 1])
            .map(|(p, s)| p * s)
            .sum::<i64>()
            * sign;
        (local - Duration::seconds(east))
            .and_utc()
            .timestamp_micros()
    }

    /// Every text names exactly the instant it was made from, in every zone shape (whole,
    /// half and quarter hours, west and east, summer time, local mean times with seconds),
    /// before 1970 and far ahead; NULLs stay NULL. Whole-hour offsets are what pgwire
    /// writes, with PostgreSQL's fractional seconds.
    #[test]
    fn every_text_names_its_instant() {
        for zone in ZONES {
            let got = texts(micros("UTC"), FormatOptions::default(), Some(zone));
            for (text, at) in got.iter().zip(INSTANTS) {
                assert_eq!(text.as_deref().map(instant_of), at, "{zone}: {text:?}");
            }
            // The column's own zone when the session sets none: the same texts.
            assert_eq!(
                texts(micros(zone), FormatOptions::default(), None),
                got,
                "{zone}"
            );
        }
        for zone in ["UTC", "+00:00", "America/New_York", "Europe/Berlin"] {
            let ts = TimestampMicrosecondArray::from(vec![
                Some(1_767_225_600_123_456),
                Some(1_720_000_000_500_000),
                None,
            ])
            .with_timezone(zone);
            let batch = batch_of(Arc::new(ts));
            let options = FormatOptions::default();
            let fields = text_fields(&batch, &options);
            let ours = timestamps_as_text(batch.clone(), &fields, &TextStyle::with(options, None));
            assert_eq!(
                row_texts(&rows(ours, &fields)),
                pg_rows(batch, &fields),
                "{zone}"
            );
        }
    }

    /// The other date styles are written as pgwire writes them, from the session's options,
    /// with PostgreSQL's fractional seconds.
    #[test]
    fn other_date_styles_are_pgwires() {
        for style in ["German", "SQL, DMY", "Postgres, MDY"] {
            let options = FormatOptions::from_client_metadata(
                &[("datestyle".to_string(), style.to_string())].into(),
            );
            for zone in ["UTC", "Asia/Kolkata"] {
                let batch = batch_of(micros(zone));
                let fields = text_fields(&batch, &options);
                let ours = timestamps_as_text(
                    batch.clone(),
                    &fields,
                    &TextStyle::with(options.clone(), None),
                );
                assert_eq!(ours.schema().field(1).data_type(), &DataType::Utf8);
                assert_eq!(
                    row_texts(&rows(ours, &fields)),
                    pg_rows(batch, &fields),
                    "{style} {zone}"
                );
            }
        }
    }

    /// Seconds, milliseconds and nanoseconds are written as their microseconds would be
    /// (finer digits cut, as pgwire does).
    #[test]
    fn every_unit_is_written() {
        let nanos: Vec<Option<i64>> = vec![Some(1_767_225_600_123_456_789), Some(-1), None];
        let as_micros: Vec<Option<i64>> = vec![Some(1_767_225_600_123_456), Some(-1), None];
        let ns = Arc::new(TimestampNanosecondArray::from(nanos).with_timezone("UTC"));
        let us = Arc::new(TimestampMicrosecondArray::from(as_micros).with_timezone("UTC"));
        let options = FormatOptions::default;
        assert_eq!(
            texts(ns, options(), Some("Asia/Kolkata")),
            texts(us, options(), Some("Asia/Kolkata"))
        );
    }

    /// Binary results, and columns that are not timestamps, are untouched; a `timestamp`
    /// (without a zone) is written as it is, with PostgreSQL's fractional seconds, whatever
    /// the session's zone.
    #[test]
    fn other_columns_and_formats_are_left_to_the_encoder() {
        let ts = TimestampMicrosecondArray::from(vec![Some(0)]).with_timezone("UTC");
        let naive = TimestampMicrosecondArray::from(vec![Some(0)]);
        let naive_ns = TimestampNanosecondArray::from(vec![Some(1_500_000_000), None]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("at", ts.data_type().clone(), true),
            Field::new("naive", naive.data_type().clone(), true),
            Field::new("n", DataType::Int64, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(ts),
                Arc::new(naive),
                Arc::new(Int64Array::from(vec![Some(7)])),
            ],
        )
        .unwrap();
        let style = TextStyle::with(FormatOptions::default(), Some("Asia/Kolkata"));
        let binary =
            Arc::new(arrow_schema_to_pg_fields(&schema, &Format::UnifiedBinary, None).unwrap());
        assert_eq!(
            timestamps_as_text(batch.clone(), &binary, &style).schema(),
            schema
        );
        let text =
            Arc::new(arrow_schema_to_pg_fields(&schema, &Format::UnifiedText, None).unwrap());
        let converted = timestamps_as_text(batch, &text, &style);
        assert_eq!(converted.schema().field(0).data_type(), &DataType::Utf8);
        assert_eq!(converted.schema().field(1).data_type(), &DataType::Utf8);
        assert_eq!(converted.schema().field(2).data_type(), &DataType::Int64);
        assert_eq!(
            row_texts(&rows(converted, &text)),
            vec![vec![
                Some("1970-01-01 05:30:00+05:30".to_string()),
                Some("1970-01-01 00:00:00".to_string()),
                Some("7".to_string()),
            ]]
        );
        let naive = batch_of(Arc::new(naive_ns));
        let fields = text_fields(&naive, &FormatOptions::default());
        let got = timestamps_as_text(naive, &fields, &style);
        assert_eq!(
            row_texts(&rows(got, &fields)),
            vec![
                vec![Some("0".into()), Some("1970-01-01 00:00:01.5".into())],
                vec![Some("1".into()), None],
            ]
        );
    }
}
