//! `date_trunc` of a UTC time without a time zone library on every row.
//!
//! Every time a table shows is a `timestamptz` kept in UTC (`Timestamp(µs, "UTC")`).
//! DataFusion's `date_trunc` takes plain arithmetic only for times without a zone; given a
//! zone, even UTC, it converts each value to a `chrono` date-time in that zone, truncates
//! the calendar fields and converts back. Over a month of archived rows that conversion was
//! the largest part of a per-day count (issue 30: 2.5x DuckDB's time on the same files,
//! when the same scan grouped by channel was at 1.2x).
//!
//! In UTC, local time is the instant itself, so truncating the instant as a time without a
//! zone gives the same answer. [`UtcDateTrunc`] wraps the built-in function: for an
//! argument whose zone is UTC it hands the built-in the same values typed without the zone
//! (the buffers are shared, nothing is copied) and types the answer back; for every other
//! zone, and for everything else the function does (its types, its ordering, its
//! `preimage`, should a later DataFusion give it one), it delegates. Within the range of a
//! nanosecond time (1677 to 2262) the answers are the built-in's by construction; a unit
//! test compares the two over every granularity, unit and edge it could differ on. Outside
//! it, the built-in refuses a UTC time of an array for `hour` and `day` (it converts each
//! to nanoseconds) where the wrapper answers as PostgreSQL does (break-it finding).

use std::sync::Arc;

use datafusion::arrow::array::{make_array, Array, ArrayRef};
use datafusion::arrow::datatypes::{DataType, FieldRef};
use datafusion::common::config::ConfigOptions;
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::interval_arithmetic::Interval;
use datafusion::logical_expr::preimage::PreimageResult;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::sort_properties::{ExprProperties, SortProperties};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ExpressionPlacement, ReturnFieldArgs, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, Signature, StructFieldMapping,
};
use datafusion::prelude::SessionContext;

/// Zone names that mean UTC exactly (every instant at offset zero). Named zones that are
/// at zero only part of the year (`Europe/London`) are not among them.
const UTC_NAMES: [&str; 5] = ["UTC", "Etc/UTC", "+00:00", "+00", "+0000"];

/// The built-in `date_trunc` with a zone-free path for UTC; see the module comment.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct UtcDateTrunc {
    inner: Arc<ScalarUDF>,
}

impl UtcDateTrunc {
    /// Wraps `inner`, the session's `date_trunc`.
    pub fn new(inner: Arc<ScalarUDF>) -> Self {
        Self { inner }
    }
}

/// Replaces the session's `date_trunc` by [`UtcDateTrunc`] around it (once: a session
/// whose function is already wrapped is left as it is).
pub fn install(ctx: &SessionContext) {
    let Some(inner) = ctx.state().scalar_functions().get("date_trunc").cloned() else {
        return;
    };
    if inner.inner().is::<UtcDateTrunc>() {
        return;
    }
    ctx.register_udf(ScalarUDF::new_from_impl(UtcDateTrunc::new(inner)));
}

fn is_utc(tz: &str) -> bool {
    UTC_NAMES.contains(&tz)
}

/// `array` typed as `data_type` (same layout: a timestamp of the same unit with another
/// zone), its buffers shared.
fn retyped(array: &ArrayRef, data_type: DataType) -> Result<ArrayRef> {
    let data = array
        .to_data()
        .into_builder()
        .data_type(data_type)
        .build()?;
    Ok(make_array(data))
}

/// A timestamp scalar with its zone replaced; `None` for any other value.
fn rezoned(value: &ScalarValue, tz: Option<Arc<str>>) -> Option<ScalarValue> {
    Some(match value {
        ScalarValue::TimestampSecond(v, _) => ScalarValue::TimestampSecond(*v, tz),
        ScalarValue::TimestampMillisecond(v, _) => ScalarValue::TimestampMillisecond(*v, tz),
        ScalarValue::TimestampMicrosecond(v, _) => ScalarValue::TimestampMicrosecond(*v, tz),
        ScalarValue::TimestampNanosecond(v, _) => ScalarValue::TimestampNanosecond(*v, tz),
        _ => return None,
    })
}

impl ScalarUDFImpl for UtcDateTrunc {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        self.inner.inner().schema_name(args)
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.inner().return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.inner.inner().return_field_from_args(args)
    }

    fn is_strict(&self) -> bool {
        self.inner.inner().is_strict()
    }

    fn invoke_with_args(&self, mut args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        // The time is the second argument; the granularity, a string, the first.
        let zone = match args.args.get(1) {
            Some(ColumnarValue::Array(a)) => match a.data_type() {
                DataType::Timestamp(unit, Some(tz)) if is_utc(tz) => Some((*unit, tz.clone())),
                _ => None,
            },
            Some(ColumnarValue::Scalar(s)) => match s.data_type() {
                DataType::Timestamp(unit, Some(tz)) if is_utc(&tz) => Some((unit, tz)),
                _ => None,
            },
            None => None,
        };
        let Some((unit, tz)) = zone else {
            return self.inner.invoke_with_args(args);
        };
        // The argument's and the answer's fields say the same as the values: no zone.
        let unzoned = |f: &FieldRef| match f.data_type() {
            DataType::Timestamp(u, Some(z)) if is_utc(z) => Arc::new(
                f.as_ref()
                    .clone()
                    .with_data_type(DataType::Timestamp(*u, None)),
            ),
            _ => f.clone(),
        };
        args.return_field = unzoned(&args.return_field);
        if let Some(f) = args.arg_fields.get_mut(1) {
            *f = unzoned(f);
        }
        args.args[1] = match &args.args[1] {
            ColumnarValue::Array(a) => {
                ColumnarValue::Array(retyped(a, DataType::Timestamp(unit, None))?)
            }
            ColumnarValue::Scalar(s) => {
                ColumnarValue::Scalar(rezoned(s, None).expect("a timestamp scalar"))
            }
        };
        Ok(match self.inner.invoke_with_args(args)? {
            ColumnarValue::Array(a) => match a.data_type() {
                DataType::Timestamp(unit, None) => {
                    let unit = *unit;
                    ColumnarValue::Array(retyped(&a, DataType::Timestamp(unit, Some(tz)))?)
                }
                _ => ColumnarValue::Array(a),
            },
            ColumnarValue::Scalar(s) => ColumnarValue::Scalar(rezoned(&s, Some(tz)).unwrap_or(s)),
        })
    }

    fn with_updated_config(&self, config: &ConfigOptions) -> Option<ScalarUDF> {
        let inner = self.inner.inner().with_updated_config(config)?;
        Some(ScalarUDF::new_from_impl(Self::new(Arc::new(inner))))
    }

    fn simplify(&self, args: Vec<Expr>, info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        self.inner.inner().simplify(args, info)
    }

    fn preimage(
        &self,
        args: &[Expr],
        lit_expr: &Expr,
        info: &SimplifyContext,
    ) -> Result<PreimageResult> {
        self.inner.inner().preimage(args, lit_expr, info)
    }

    fn conditional_arguments<'a>(
        &self,
        args: &'a [Expr],
    ) -> Option<(Vec<&'a Expr>, Vec<&'a Expr>)> {
        self.inner.inner().conditional_arguments(args)
    }

    fn short_circuits(&self) -> bool {
        self.inner.inner().short_circuits()
    }

    fn evaluate_bounds(&self, input: &[&Interval]) -> Result<Interval> {
        self.inner.inner().evaluate_bounds(input)
    }

    fn propagate_constraints(
        &self,
        interval: &Interval,
        inputs: &[&Interval],
    ) -> Result<Option<Vec<Interval>>> {
        self.inner.inner().propagate_constraints(interval, inputs)
    }

    fn struct_field_mapping(
        &self,
        literal_args: &[Option<ScalarValue>],
    ) -> Option<StructFieldMapping> {
        self.inner.inner().struct_field_mapping(literal_args)
    }

    fn output_ordering(&self, inputs: &[ExprProperties]) -> Result<SortProperties> {
        self.inner.inner().output_ordering(inputs)
    }

    fn preserves_lex_ordering(&self, inputs: &[ExprProperties]) -> Result<bool> {
        self.inner.inner().preserves_lex_ordering(inputs)
    }

    fn strictly_order_preserving(&self, inputs: &[ExprProperties]) -> Result<bool> {
        self.inner.inner().strictly_order_preserving(inputs)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.inner().coerce_types(arg_types)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.inner().documentation()
    }

    fn placement(&self, args: &[ExpressionPlacement]) -> ExpressionPlacement {
        self.inner.inner().placement(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{
        TimestampMicrosecondArray, TimestampMillisecondArray, TimestampNanosecondArray,
        TimestampSecondArray,
    };
    use datafusion::arrow::datatypes::{Field, TimeUnit};

    /// Values a truncation could get wrong: around the epoch, before it, leap days, ends
    /// of years and weeks, the extremes of the nanosecond range, and a null.
    fn instants_us() -> Vec<Option<i64>> {
        let day = 86_400_000_000i64;
        let mut v = vec![
            Some(0),
            Some(-1),
            Some(1),
            Some(-day),
            Some(-day - 1),
            Some(day - 1),
            None,
            // 2024-02-29 23:59:59.999999, 2023-12-31 23:59:59.999999, 1969-12-28.
            Some(1_709_251_199_999_999),
            Some(1_704_067_199_999_999),
            Some(-4 * day + 17),
            // 1677 and 2262: the edges of a nanosecond time.
            Some(-9_223_372_036_854_775 + day),
            Some(9_223_372_036_854_775 - day),
        ];
        // A deterministic spread over 1900..2100.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..500 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let span = 6_311_390_400_000_000i64; // 200 years of µs
            v.push(Some((x % (span as u64)) as i64 - 2_208_988_800_000_000));
        }
        v
    }

    fn array(unit: TimeUnit, tz: Option<&str>) -> ArrayRef {
        let tz: Option<Arc<str>> = tz.map(Into::into);
        let us = instants_us();
        let scaled = |f: fn(i64) -> i64| us.iter().map(|v| v.map(f)).collect::<Vec<_>>();
        match unit {
            TimeUnit::Second => Arc::new(
                TimestampSecondArray::from(scaled(|v| v.div_euclid(1_000_000)))
                    .with_timezone_opt(tz),
            ),
            TimeUnit::Millisecond => Arc::new(
                TimestampMillisecondArray::from(scaled(|v| v.div_euclid(1_000)))
                    .with_timezone_opt(tz),
            ),
            TimeUnit::Microsecond => {
                Arc::new(TimestampMicrosecondArray::from(us).with_timezone_opt(tz))
            }
            // Within the nanosecond range only.
            TimeUnit::Nanosecond => Arc::new(
                TimestampNanosecondArray::from(scaled(|v| v.saturating_mul(1_000)))
                    .with_timezone_opt(tz),
            ),
        }
    }

    fn call(f: &ScalarUDF, granularity: &str, value: ColumnarValue) -> Result<ColumnarValue> {
        let args = vec![
            ColumnarValue::Scalar(ScalarValue::Utf8(Some(granularity.into()))),
            value,
        ];
        let arg_fields: Vec<FieldRef> = args
            .iter()
            .enumerate()
            .map(|(i, a)| Arc::new(Field::new(format!("a{i}"), a.data_type(), true)))
            .collect();
        let return_field = f.return_field_from_args(ReturnFieldArgs {
            arg_fields: &arg_fields,
            scalar_arguments: &[None, None],
        })?;
        f.invoke_with_args(ScalarFunctionArgs {
            number_rows: match &args[1] {
                ColumnarValue::Array(a) => a.len(),
                ColumnarValue::Scalar(_) => 1,
            },
            args,
            arg_fields,
            return_field,
            config_options: Arc::new(ConfigOptions::default()),
        })
    }

    fn builtin() -> Arc<ScalarUDF> {
        datafusion::functions::datetime::date_trunc()
    }

    #[test]
    fn answers_as_the_builtin_for_every_granularity_unit_and_zone() {
        let ours = ScalarUDF::new_from_impl(UtcDateTrunc::new(builtin()));
        let theirs = builtin();
        let granularities = [
            "microsecond",
            "millisecond",
            "second",
            "minute",
            "hour",
            "day",
            "week",
            "month",
            "quarter",
            "year",
        ];
        let units = [
            TimeUnit::Second,
            TimeUnit::Millisecond,
            TimeUnit::Microsecond,
            TimeUnit::Nanosecond,
        ];
        for tz in [
            Some("UTC"),
            Some("+00:00"),
            Some("Etc/UTC"),
            Some("America/New_York"),
            None,
        ] {
            for unit in units {
                let input = array(unit, tz);
                for g in granularities {
                    let a = call(&ours, g, ColumnarValue::Array(input.clone()));
                    let b = call(&theirs, g, ColumnarValue::Array(input.clone()));
                    match (a, b) {
                        (Ok(a), Ok(b)) => {
                            let (a, b) = (a.into_array(1).unwrap(), b.into_array(1).unwrap());
                            assert_eq!(a.data_type(), b.data_type(), "{g} {unit:?} {tz:?}");
                            assert_eq!(a.to_data(), b.to_data(), "{g} {unit:?} {tz:?}");
                        }
                        // Both refuse (a value out of range after truncating), or neither.
                        (Err(_), Err(_)) => {}
                        (a, b) => panic!("{g} {unit:?} {tz:?}: ours {a:?}, built-in {b:?}"),
                    }
                    // Each value alone, as a scalar.
                    for i in [0, 1, 6, 7, 9, 20] {
                        let s = ScalarValue::try_from_array(&input, i).unwrap();
                        let a = call(&ours, g, ColumnarValue::Scalar(s.clone()));
                        let b = call(&theirs, g, ColumnarValue::Scalar(s));
                        match (a, b) {
                            (Ok(ColumnarValue::Scalar(a)), Ok(ColumnarValue::Scalar(b))) => {
                                assert_eq!(a, b, "{g} {unit:?} {tz:?} #{i}")
                            }
                            (Err(_), Err(_)) => {}
                            (a, b) => panic!("{g} {unit:?} {tz:?} #{i}: {a:?} / {b:?}"),
                        }
                    }
                }
            }
        }
    }

    /// A microsecond time outside the nanosecond range is truncated, as PostgreSQL
    /// truncates it (`1600-03-01 00:00:00+00`), where the built-in refuses it.
    #[test]
    fn times_outside_the_nanosecond_range_are_truncated() {
        let ours = ScalarUDF::new_from_impl(UtcDateTrunc::new(builtin()));
        // 1600-03-01 13:45:00 UTC.
        let at = -11_670_862_500_000_000i64;
        let input: ArrayRef =
            Arc::new(TimestampMicrosecondArray::from(vec![Some(at)]).with_timezone("UTC"));
        let day = call(&ours, "day", ColumnarValue::Array(input.clone())).unwrap();
        let day = day.into_array(1).unwrap();
        assert_eq!(day.data_type(), input.data_type());
        let want = -11_670_912_000_000_000i64;
        assert_eq!(
            ScalarValue::try_from_array(&day, 0).unwrap(),
            ScalarValue::TimestampMicrosecond(Some(want), Some("UTC".into()))
        );
        assert!(call(&builtin(), "day", ColumnarValue::Array(input)).is_err());
    }

    #[test]
    fn takes_the_zone_free_path_only_for_utc() {
        for tz in UTC_NAMES {
            assert!(is_utc(tz), "{tz}");
        }
        for tz in ["Europe/London", "utc+1", "+01:00", "-00:30", "GMT", "Z", ""] {
            assert!(!is_utc(tz), "{tz}");
        }
    }

    #[tokio::test]
    async fn the_session_function_is_wrapped_once_and_keeps_its_name() {
        let ctx = SessionContext::new();
        install(&ctx);
        install(&ctx);
        let f = ctx
            .state()
            .scalar_functions()
            .get("date_trunc")
            .cloned()
            .unwrap();
        let wrapped = f.inner().downcast_ref::<UtcDateTrunc>().unwrap();
        assert!(!wrapped.inner.inner().is::<UtcDateTrunc>());
        let batches = ctx
            .sql(
                "SELECT date_trunc('day', arrow_cast(TIMESTAMP '2026-03-08T23:59:59Z', \
                 'Timestamp(Microsecond, Some(\"UTC\"))'))::text AS d",
            )
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string();
        assert!(text.contains("2026-03-08T00:00:00Z"), "{text}");
    }
}
