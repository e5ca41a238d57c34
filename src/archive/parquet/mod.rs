//! The Parquet payload: the record schema v2 envelope, the writer settings of the
//! deterministic streaming encoder, and the error mapping shared by reads and writes.
//!
//! Files are plain Parquet (zstd, statistics and page index, `sorting_columns` declared), so
//! DataFusion's own Parquet reader can scan them through an `object_store` bridge. Encoding is
//! deterministic for a given sequence of records (fixed `created_by`, no timestamps, input
//! re-chunked into fixed-size batches before it reaches the encoder), so a retried write of
//! the same snapshot produces the same bytes and finds its earlier payload identical.
//!
//! # Layout
//!
//! - this file: the envelope re-exports, row-group and page sizes, [`writer_properties`]
//!   and [`from_parquet`];
//! - `sink.rs`: [`PayloadSink`], where encoded bytes go (hashed, counted, uploaded, and the
//!   upload aborted when the write does not complete);
//! - `read.rs`: the verified, ranged scan (footer cache, block-verified reader, row checks,
//!   descending reads) and the in-memory decoder;
//! - `prune.rs`: which row groups, pages and rows a scan's bounds select.

mod columns;
mod prune;
mod read;
mod sink;

use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::metadata::SortingColumn;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use super::ArchiveError;
use crate::model::envelope::{COL_SORT, COL_TIME};
pub use crate::model::{envelope_schema, records_to_batch};
pub use columns::ValueColumns;
pub(crate) use columns::{decoded_envelope, projected_columns, to_envelope, RESIDUAL};
pub(crate) use read::{decode_all, excluded_by_values, scan, scan_with, FooterCache};
pub(crate) use sink::PayloadSink;

/// Rows per row group: 64 Ki rows keeps a row group's encoded buffer in the writer to a few
/// MiB for typical values, and makes statistics fine-grained enough that a time-range read
/// of a year bucket touches a small fraction of it.
pub const ROW_GROUP_ROWS: usize = 64 * 1024;
/// Rows per data page (the page index granularity inside a row group) at the default size.
const PAGE_ROWS: usize = 8 * 1024;
/// Records per batch handed to the encoder; fixed so page boundaries never depend on how the
/// caller paged the snapshot.
pub(crate) const ENCODE_BATCH_ROWS: usize = 8 * 1024;
/// `created_by` written in every file: fixed, so the bytes do not depend on the build.
const CREATED_BY: &str = "pulpitum archive (record schema v2)";

/// The writer settings of archive Parquet files with row groups of `row_group_rows` rows
/// ([`ROW_GROUP_ROWS`] by default; public so the benchmark's baseline writes with exactly the
/// same encoding). Pages hold at most an eighth of a row group, and at most 8192 rows.
pub fn writer_properties(row_group_rows: usize) -> WriterProperties {
    let col = |name: &str| ColumnPath::from(name);
    let row_group_rows = row_group_rows.max(8);
    let page_rows = PAGE_ROWS.min(row_group_rows / 8);
    WriterProperties::builder()
        .set_created_by(CREATED_BY.to_string())
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(3).expect("valid zstd level"),
        ))
        .set_max_row_group_row_count(Some(row_group_rows))
        .set_data_page_row_count_limit(page_rows)
        .set_write_batch_size(page_rows.min(1024))
        .set_statistics_enabled(EnabledStatistics::Page)
        // Unique keys and opaque values gain nothing from a dictionary; the partition key is
        // one value per file and compresses to almost nothing with one.
        .set_dictionary_enabled(false)
        .set_column_dictionary_enabled(col("partition_key"), true)
        .set_column_encoding(col("event_time"), Encoding::DELTA_BINARY_PACKED)
        .set_sorting_columns(Some(vec![
            SortingColumn {
                column_idx: COL_TIME as i32,
                descending: false,
                nulls_first: false,
            },
            SortingColumn {
                column_idx: COL_SORT as i32,
                descending: false,
                nulls_first: false,
            },
        ]))
        .build()
}

/// Maps a Parquet error back, recovering storage and archive errors smuggled through it.
pub(crate) fn from_parquet(key: &str, op: &'static str, e: ParquetError) -> ArchiveError {
    match e {
        ParquetError::External(inner) => match inner.downcast::<ArchiveError>() {
            Ok(a) => *a,
            Err(inner) => match inner.downcast::<opendal::Error>() {
                Ok(o) => ArchiveError::storage(op, key, *o),
                Err(other) => ArchiveError::decode(key, other),
            },
        },
        // Lengths are verified before Parquet sees a byte, so a Parquet "end of file" means a
        // footer or page that claims more bytes than exist: damaged encoding, not truncation.
        other => ArchiveError::decode(key, other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{batch_to_records, EventTime, PartitionKey, Record, SortKey};

    fn rec(us: i64, k: &[u8], v: &[u8]) -> Record {
        Record {
            partition_key: PartitionKey::new(vec![7]).unwrap(),
            event_time: EventTime::from_micros(us).unwrap(),
            sort_key: SortKey::new(k.to_vec()).unwrap(),
            value: v.to_vec(),
        }
    }

    #[test]
    fn batches_round_trip() {
        let rs = vec![
            rec(1_700_000_000_000_000, b"a", b"x"),
            rec(1_700_000_000_000_001, b"", b""),
        ];
        let b = records_to_batch(&rs, true);
        assert_eq!(b.schema(), envelope_schema(true));
        assert_eq!(batch_to_records(&b).unwrap(), rs);
        let nv = records_to_batch(&rs, false);
        assert_eq!(nv.num_columns(), 3);
        assert!(batch_to_records(&nv).is_err());
    }
}
