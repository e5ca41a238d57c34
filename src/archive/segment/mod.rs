//! Segments: one archive object holding the buckets of many partitions for one window.
//!
//! A per-bucket archive is ideal at cutover and wasteful for ever after: millions of small
//! objects, each a PUT to write and a GET (plus a manifest GET) to read. The compactor
//! (`crate::archiver::compact`) rewrites the published buckets of a window (a month of day
//! buckets, a year of month buckets) into segments sorted by `(partition_key, event_time,
//! sort_key)`, split by partition-key range toward a target size, and switches the
//! buckets' routes to them. This module is the storage half: the v6 manifest (v5 still
//! read; `manifest.rs`), the streaming writer that encodes a segment into a spill file (`write.rs`) and uploads,
//! verifies and commits it (`upload.rs`), the
//! pruned reader that streams one bucket's row groups (`pruned.rs`, v6) and the reader
//! that fetches a whole partition with ranged reads verified per row group (`read.rs`, v5).
//! The design and its reasons are in `docs/segments.md`, the format in
//! `docs/archive-format.md`.

mod manifest;
pub(crate) mod pruned;
pub(crate) mod read;
mod upload;
mod write;

pub use manifest::{
    BucketEntry, ByteRange, GroupSlice, PartitionEntry, RowGroupEntry, SegmentManifest,
    SEGMENT_KIND, SEGMENT_MANIFEST_VERSION, SEGMENT_MANIFEST_VERSIONS,
};
pub(crate) use read::SegmentCache;
pub use upload::probe_spill_dir;
pub(crate) use write::write_segment;
pub use write::{
    SegmentSpec, SegmentUpload, SegmentWriter, WrittenSegment, GROUP_MAX_BYTES, GROUP_MIN_ROWS,
    SEGMENT_PART_BYTES, SEGMENT_PUT_MAX_BYTES,
};

/// The path component every segment key holds (`<prefix>/v4/<table>/segments/...`): how a
/// route names a segment rather than a per-bucket archive.
pub const SEGMENTS_DIR: &str = "/segments/";
