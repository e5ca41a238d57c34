//! Recording the bucket counts of segments whose count is not known.
//!
//! A listing across partitions reads a segment's buckets from its manifest only when its
//! route records how many buckets the manifest holds and that many are still routed to it
//! (docs/segments.md, section 7a). Segments switched before segment routes existed, or by
//! an erasure's re-apply, are recorded with their count not known (`-1`), and their buckets
//! are listed one by one for every query that overlaps their window. Each full GC pass
//! reads the manifests of such segments and records their counts, so an upgraded
//! deployment's history gets the same listing as a newly compacted one.
//!
//! The count is taken from the manifest, which is immutable, and never from the routes: a
//! segment some bucket has left since must stay short of its count, or the listing would
//! name it whole and read that bucket from it again. A manifest that cannot be read or that
//! names another table is left uncounted (it is tried again at the next full pass): its
//! buckets keep being listed one by one, which is always correct.

use tracing::{debug, info, warn};

use crate::archive::ArchiveStore;
use crate::store::HotStore;

use super::ArchiverError;

/// Segment routes read per statement while looking for counts not known.
const PAGE: usize = 500;

/// What one recounting saw and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentCounts {
    /// Segments whose count was recorded.
    pub recorded: u64,
    /// Segments left uncounted: their manifest could not be read, or names another table.
    pub unreadable: u64,
}

/// Reads the manifest of every segment recorded with its count not known and records the
/// count. Store errors end the pass (the next one starts over); an unreadable manifest only
/// skips its segment.
pub async fn record_segment_counts(
    store: &dyn HotStore,
    archive: &ArchiveStore,
) -> Result<SegmentCounts, ArchiverError> {
    let mut done = SegmentCounts::default();
    let mut after = None;
    loop {
        let page = store.segments_not_counted(after.as_ref(), PAGE).await?;
        for (table, key) in &page {
            // A route under another archive root is another archiver's to count.
            if !archive.holds_key(key) {
                continue;
            }
            match archive.read_segment_manifest(key).await {
                Ok(m) if m.table_id == *table => {
                    let n = m.buckets().count() as u64;
                    if store.record_segment_count(table, key, n).await? {
                        done.recorded += 1;
                    }
                }
                Ok(m) => {
                    warn!(table = %table, segment = %key, manifest_table = %m.table_id, "segment manifest names another table; its count is left unknown");
                    done.unreadable += 1;
                }
                // Mostly a segment no bucket routes to any more, whose objects GC deleted:
                // counted in the pass's summary rather than logged at every full pass.
                Err(e) => {
                    debug!(table = %table, segment = %key, error = %e, "segment manifest unreadable; its count is left unknown");
                    done.unreadable += 1;
                }
            }
        }
        if page.len() < PAGE {
            break;
        }
        after = page.last().cloned();
    }
    if done.recorded > 0 || done.unreadable > 0 {
        info!(
            recorded = done.recorded,
            unreadable = done.unreadable,
            "segment counts recorded"
        );
    }
    Ok(done)
}
