//! Pruning of a Parquet scan by its [`ScanBounds`]: row groups whose statistics miss the
//! bounds are skipped, pages of the row groups left whose event-time range misses them are
//! skipped through the page index (rows are sorted by time, so a narrow time range selects
//! a few pages of a large row group), and the rows read are filtered on their raw column
//! values.
//!
//! A declared table's columnar payloads are pruned the same way by the predicates on value
//! columns a scan may apply early ([`prune_by_values`]), from each column's own statistics
//! and page index.
//!
//! Pruning only narrows what is read; every row that is read is still checked (see
//! `read.rs`), and statistics are treated conservatively, so a pruned scan returns what a
//! full scan filtered by the bounds returns.

use std::ops::Bound;

use datafusion::arrow::array::{
    Array, ArrayRef, BinaryArray, BooleanArray, TimestampNanosecondArray, UInt64Array,
};
use datafusion::arrow::datatypes::Schema;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::RecordBatch;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use parquet::file::metadata::ParquetMetaData;
use parquet::file::page_index::column_index::ColumnIndexMetaData;
use parquet::file::statistics::Statistics;

use crate::archive::ArchiveScanMetrics;
use crate::model::envelope::{COL_SORT, COL_TIME};
use crate::model::schema::predicate::ValuePredicate;
use crate::model::schema::ColumnType;
use crate::model::ScanBounds;

/// The scan plan of one row group: its index and the pages to read (`None` = all).
pub(super) struct RowGroupPlan {
    pub(super) index: usize,
    pub(super) selection: Option<RowSelection>,
}

fn sort_stat_excludes(bounds: &ScanBounds, min: &[u8], max: &[u8]) -> bool {
    // Byte-array statistics may be truncated: min is then a prefix (<= the true min) and max
    // an incremented prefix (>= the true max), so these comparisons stay conservative.
    let below = match &bounds.sort_lower {
        Bound::Included(x) => max < x.as_bytes(),
        Bound::Excluded(x) => max <= x.as_bytes(),
        Bound::Unbounded => false,
    };
    let above = match &bounds.sort_upper {
        Bound::Included(x) => min > x.as_bytes(),
        Bound::Excluded(x) => min >= x.as_bytes(),
        Bound::Unbounded => false,
    };
    below || above
}

pub(super) fn plan_row_groups(
    meta: &ParquetMetaData,
    bounds: &ScanBounds,
    metrics: &ArchiveScanMetrics,
) -> Vec<RowGroupPlan> {
    let Some((lo, hi)) = bounds.time_interval() else {
        ArchiveScanMetrics::add(&metrics.row_groups_pruned, meta.num_row_groups() as u64);
        return Vec::new();
    };
    let (lo, hi) = (lo.as_nanos(), hi.as_nanos());
    let mut plan = Vec::new();
    for (i, rg) in meta.row_groups().iter().enumerate() {
        let time_out = match rg.column(COL_TIME).statistics() {
            Some(Statistics::Int64(s)) => match (s.min_opt(), s.max_opt()) {
                (Some(mn), Some(mx)) => *mx < lo || *mn > hi,
                _ => false,
            },
            _ => false,
        };
        let sort_out = match rg.column(COL_SORT).statistics() {
            Some(Statistics::ByteArray(s)) => match (s.min_opt(), s.max_opt()) {
                (Some(mn), Some(mx)) => sort_stat_excludes(bounds, mn.data(), mx.data()),
                _ => false,
            },
            _ => false,
        };
        if time_out || sort_out {
            ArchiveScanMetrics::add(&metrics.row_groups_pruned, 1);
            continue;
        }
        let selection = page_selection(meta, i, lo, hi, metrics);
        plan.push(RowGroupPlan {
            index: i,
            selection,
        });
    }
    plan
}

/// Pages of row group `rg` whose event-time range misses `[lo, hi]` are skipped: rows are
/// sorted by time, so a narrow time range selects a few pages of a large row group.
fn page_selection(
    meta: &ParquetMetaData,
    rg: usize,
    lo: i64,
    hi: i64,
    metrics: &ArchiveScanMetrics,
) -> Option<RowSelection> {
    let ci = meta.column_index()?.get(rg)?.get(COL_TIME)?;
    let oi = meta.offset_index()?.get(rg)?.get(COL_TIME)?;
    let ColumnIndexMetaData::INT64(idx) = ci else {
        return None;
    };
    let locs = oi.page_locations();
    let rows = meta.row_group(rg).num_rows() as usize;
    let mut pages = Vec::with_capacity(locs.len());
    for (i, loc) in locs.iter().enumerate() {
        let start = loc.first_row_index as usize;
        let end = locs.get(i + 1).map_or(rows, |l| l.first_row_index as usize);
        let keep = match (idx.min_value(i), idx.max_value(i)) {
            (Some(mn), Some(mx)) => !(*mx < lo || *mn > hi),
            _ => true,
        };
        pages.push((end - start, keep));
    }
    selection_of(&pages, metrics)
}

/// The selection of a row group's pages, given as `(rows, keep)`; `None` when every page
/// is kept. Counts the pages skipped.
fn selection_of(pages: &[(usize, bool)], metrics: &ArchiveScanMetrics) -> Option<RowSelection> {
    let skipped = pages.iter().filter(|(_, keep)| !keep).count() as u64;
    if skipped == 0 {
        return None;
    }
    ArchiveScanMetrics::add(&metrics.pages_pruned, skipped);
    Some(RowSelection::from(
        pages
            .iter()
            .map(|&(n, keep)| {
                if keep {
                    RowSelector::select(n)
                } else {
                    RowSelector::skip(n)
                }
            })
            .collect::<Vec<_>>(),
    ))
}

/// A value predicate as it applies to one payload: the file column it reads (by index into
/// the file's columns) and the type that column was written with.
pub(super) struct FilePredicate {
    pub(super) predicate: ValuePredicate,
    pub(super) column: usize,
    pub(super) stored: ColumnType,
}

/// Drops from `plan` the row groups whose statistics show that some predicate holds for
/// none of their rows, and narrows the pages of the rest through the page index of each
/// predicate's column. Statistics that are missing or cannot be read exclude nothing.
pub(super) fn prune_by_values(
    meta: &ParquetMetaData,
    file_schema: &Schema,
    plan: Vec<RowGroupPlan>,
    filters: &[FilePredicate],
    metrics: &ArchiveScanMetrics,
) -> Vec<RowGroupPlan> {
    if filters.is_empty() {
        return plan;
    }
    let stats = row_group_stats(meta, file_schema, filters);
    let mut out = Vec::with_capacity(plan.len());
    for mut rg in plan {
        if excluded(meta, rg.index, filters, &stats) {
            ArchiveScanMetrics::add(&metrics.row_groups_pruned, 1);
            continue;
        }
        for (f, st) in filters.iter().zip(&stats) {
            let Some(st) = st else { continue };
            let Some(sel) = value_page_selection(meta, rg.index, f, &st.conv, metrics) else {
                continue;
            };
            rg.selection = Some(match rg.selection.take() {
                None => sel,
                Some(old) => old.intersection(&sel),
            });
        }
        if rg.selection.as_ref().is_some_and(|s| !s.selects_any()) {
            // Every page of the row group excluded: nothing to open.
            ArchiveScanMetrics::add(&metrics.row_groups_pruned, 1);
            continue;
        }
        out.push(rg);
    }
    out
}

/// Each predicate's statistics over every row group (`None` where they cannot be read).
fn row_group_stats<'a>(
    meta: &'a ParquetMetaData,
    file_schema: &'a Schema,
    filters: &[FilePredicate],
) -> Vec<Option<RowGroupStats<'a>>> {
    let descr = meta.file_metadata().schema_descr();
    filters
        .iter()
        .map(|f| {
            let conv = StatisticsConverter::try_new(
                file_schema.field(f.column).name(),
                file_schema,
                descr,
            )
            .ok()?;
            Some(RowGroupStats {
                mins: conv.row_group_mins(meta.row_groups().iter()).ok()?,
                maxes: conv.row_group_maxes(meta.row_groups().iter()).ok()?,
                nulls: conv.row_group_null_counts(meta.row_groups().iter()).ok()?,
                conv,
            })
        })
        .collect()
}

/// Whether row group `i`'s statistics show that some predicate holds for none of its rows.
fn excluded(
    meta: &ParquetMetaData,
    i: usize,
    filters: &[FilePredicate],
    stats: &[Option<RowGroupStats<'_>>],
) -> bool {
    let rows = meta.row_group(i).num_rows().max(0) as u64;
    filters.iter().zip(stats).any(|(f, st)| {
        let Some(st) = st else { return false };
        let nulls = st.nulls.is_valid(i).then(|| st.nulls.value(i));
        !f.predicate.may_match(
            f.stored,
            &st.mins.slice(i, 1),
            &st.maxes.slice(i, 1),
            nulls,
            rows,
        )
    })
}

/// Which row groups of a file the predicates exclude from their statistics (a segment's
/// reads skip those slices without fetching them).
pub(super) fn excluded_row_groups(
    meta: &ParquetMetaData,
    file_schema: &Schema,
    filters: &[FilePredicate],
) -> Vec<bool> {
    let stats = row_group_stats(meta, file_schema, filters);
    (0..meta.num_row_groups())
        .map(|i| !filters.is_empty() && excluded(meta, i, filters, &stats))
        .collect()
}

struct RowGroupStats<'a> {
    conv: StatisticsConverter<'a>,
    mins: ArrayRef,
    maxes: ArrayRef,
    nulls: UInt64Array,
}

/// The pages of row group `rg` whose statistics (in the page index of the predicate's own
/// column, whose page boundaries are its own) show no row can match are skipped; `None`
/// when none is, or the page index is missing.
fn value_page_selection(
    meta: &ParquetMetaData,
    rg: usize,
    f: &FilePredicate,
    conv: &StatisticsConverter<'_>,
    metrics: &ArchiveScanMetrics,
) -> Option<RowSelection> {
    let col = conv.parquet_column_index()?;
    let (ci, oi) = (meta.column_index()?, meta.offset_index()?);
    // The converter indexes without checking; a page index without this column is skipped.
    ci.get(rg)?.get(col)?;
    let locs = oi.get(rg)?.get(col)?.page_locations();
    if locs.is_empty() {
        return None;
    }
    let mins = conv.data_page_mins(ci, oi, [&rg]).ok()?;
    let maxes = conv.data_page_maxes(ci, oi, [&rg]).ok()?;
    let nulls = conv.data_page_null_counts(ci, oi, [&rg]).ok()?;
    if mins.len() != locs.len() || maxes.len() != locs.len() || nulls.len() != locs.len() {
        return None;
    }
    let rows = meta.row_group(rg).num_rows().max(0) as usize;
    let mut pages = Vec::with_capacity(locs.len());
    for (i, loc) in locs.iter().enumerate() {
        let start = loc.first_row_index.max(0) as usize;
        let end = locs
            .get(i + 1)
            .map_or(rows, |l| l.first_row_index.max(0) as usize);
        if end < start || end > rows {
            return None;
        }
        let n = nulls.is_valid(i).then(|| nulls.value(i));
        let keep = f.predicate.may_match(
            f.stored,
            &mins.slice(i, 1),
            &maxes.slice(i, 1),
            n,
            (end - start) as u64,
        );
        pages.push((end - start, keep));
    }
    selection_of(&pages, metrics)
}

/// [`ScanBounds::matches_key`] on raw column values, without allocating a `SortKey` per row.
/// The scan tests compare its results with `ScanBounds::matches` record by record.
fn matches_raw(b: &ScanBounds, micros: i64, k: &[u8]) -> bool {
    let t_ok = match b.time_lower {
        Bound::Included(x) => micros >= x.as_micros(),
        Bound::Excluded(x) => micros > x.as_micros(),
        Bound::Unbounded => true,
    } && match b.time_upper {
        Bound::Included(x) => micros <= x.as_micros(),
        Bound::Excluded(x) => micros < x.as_micros(),
        Bound::Unbounded => true,
    };
    let s_ok = match &b.sort_lower {
        Bound::Included(x) => k >= x.as_bytes(),
        Bound::Excluded(x) => k > x.as_bytes(),
        Bound::Unbounded => true,
    } && match &b.sort_upper {
        Bound::Included(x) => k <= x.as_bytes(),
        Bound::Excluded(x) => k < x.as_bytes(),
        Bound::Unbounded => true,
    };
    let after_ok = b
        .after
        .as_ref()
        .is_none_or(|c| (micros, k) > (c.event_time.as_micros(), c.sort_key.as_bytes()));
    let before_ok = b
        .before
        .as_ref()
        .is_none_or(|c| (micros, k) < (c.event_time.as_micros(), c.sort_key.as_bytes()));
    t_ok && s_ok && after_ok && before_ok
}

pub(super) fn filter_mask(b: &ScanBounds, batch: &RecordBatch) -> Result<BooleanArray, ArrowError> {
    let t = batch
        .column_by_name("event_time")
        .and_then(|c| c.as_any().downcast_ref::<TimestampNanosecondArray>())
        .ok_or_else(|| ArrowError::SchemaError("filter needs event_time".into()))?;
    let k = batch
        .column_by_name("sort_key")
        .and_then(|c| c.as_any().downcast_ref::<BinaryArray>())
        .ok_or_else(|| ArrowError::SchemaError("filter needs sort_key".into()))?;
    Ok((0..batch.num_rows())
        .map(|i| Some(matches_raw(b, t.value(i).div_euclid(1000), k.value(i))))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ClusteringKey, EventTime, PartitionKey, Record, SortKey};

    fn rec(us: i64, k: &[u8], v: &[u8]) -> Record {
        Record {
            partition_key: PartitionKey::new(vec![7]).unwrap(),
            event_time: EventTime::from_micros(us).unwrap(),
            sort_key: SortKey::new(k.to_vec()).unwrap(),
            value: v.to_vec(),
        }
    }

    #[test]
    fn raw_matching_agrees_with_the_model() {
        let base = 1_700_000_000_000_000;
        let keys: [&[u8]; 4] = [b"", b"a", b"b", b"bb"];
        let mut boundss = vec![ScanBounds::all()];
        for (i, k) in keys.iter().enumerate() {
            let t = EventTime::from_micros(base + i as i64).unwrap();
            let sk = SortKey::new(k.to_vec()).unwrap();
            boundss.push(ScanBounds {
                time_lower: Bound::Excluded(t),
                sort_upper: Bound::Included(sk.clone()),
                ..ScanBounds::all()
            });
            boundss.push(ScanBounds::all().with_after(ClusteringKey {
                event_time: t,
                sort_key: sk.clone(),
            }));
            boundss.push(ScanBounds {
                time_upper: Bound::Included(t),
                sort_lower: Bound::Excluded(sk.clone()),
                ..ScanBounds::all().with_before(ClusteringKey {
                    event_time: t,
                    sort_key: sk,
                })
            });
        }
        for b in &boundss {
            for i in 0..4 {
                for k in keys {
                    let r = rec(base + i, k, b"");
                    assert_eq!(
                        matches_raw(b, base + i, k),
                        b.matches(&r),
                        "{b:?} {i} {k:?}"
                    );
                }
            }
        }
    }
}
