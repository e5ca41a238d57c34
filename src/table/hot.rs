//! The hot tier's reader: pages of a Hot or Archiving bucket's rows, each read with the
//! bucket's route in one statement, and head reads (a partition's first bucket in scan
//! order, its route and its first page in one statement).
//!
//! A hot read asks for one page at a time, keyset-paged from the last row it returned, no
//! larger than the rows its [`RowLimit`] still wants. When a page's route says the bucket
//! was published in between, the read hands over to the archive at the same cursor
//! ([`Step::Moved`]), so one page never mixes tiers and no row is returned twice. Both a
//! page and a head answer with the store's one hot-page shape (an envelope batch), and
//! [`page_chunk`] turns either into a chunk and the next page's cursor; the rows are
//! counted against the limit once, above every reader ([`RowLimit`]).

use std::time::Instant;

use datafusion::arrow::record_batch::RecordBatch;
use futures::stream::{self, BoxStream, StreamExt};

use super::routes::Step;
use super::{BucketChunk, BucketScan, DurableTable, Route, RowLimit, TableError, Tier};
use crate::model::envelope::last_clustering_key;
use crate::model::{BucketId, EventTime, PartitionKey, ScanBounds};
use crate::store::{HotPage, PageRequest};

/// What a head read found: one partition's first bucket in scan order and what its first
/// page said.
pub(super) struct Head {
    /// The bucket.
    pub bucket: BucketId,
    /// Its first page: rows, the route elsewhere ([`Step::Moved`] from the read's own
    /// bounds), or nothing (the bucket holds no records).
    pub first: Option<Step>,
    /// Where the bucket's next page starts when the first page was full.
    pub next: Option<ScanBounds>,
}

impl DurableTable {
    /// Streams a hot bucket's pages matching `bounds`, each with its route, until a page is
    /// short, the limit is reached, or the route moves elsewhere ([`Step::Moved`], last).
    pub(super) fn read_hot(
        &self,
        bucket: BucketId,
        bounds: ScanBounds,
        req: &BucketScan,
        limit: &RowLimit,
        first_of_bucket: bool,
    ) -> BoxStream<'static, Result<Step, TableError>> {
        // The read's context travels in the state, so a page costs no copies of it.
        let read = (self.clone(), bucket, req.clone(), limit.clone());
        stream::try_unfold(Some((read, bounds, first_of_bucket)), |at| async move {
            let Some(((table, bucket, req, limit), bounds, first_of_bucket)) = at else {
                return Ok(None);
            };
            let left = limit.left();
            if left == 0 {
                return Ok(None);
            }
            let page = page_request(&req, bounds, left);
            let read_at = Instant::now();
            match table.inner.store.read_page(&bucket, &page).await? {
                HotPage::Missing => Ok(None),
                HotPage::Archived { object_key } => {
                    let moved = Step::Moved {
                        route: Route::Archived {
                            object_key,
                            read_at,
                        },
                        bounds: page.bounds,
                        first_of_bucket,
                    };
                    Ok(Some((moved, None)))
                }
                // An empty page: nothing (more) matches in this bucket.
                HotPage::Hot { rows, .. } if rows.num_rows() == 0 => Ok(None),
                HotPage::Hot { rows, .. } => {
                    let (chunk, next) = page_chunk(rows, &page, first_of_bucket)?;
                    let read = (table, bucket, req, limit);
                    Ok(Some((Step::Rows(chunk), next.map(|b| (read, b, false)))))
                }
            }
        })
        .boxed()
    }

    /// The first of `partition`'s buckets overlapping `[from, to]` in scan order, with its
    /// route and first page, in one statement (`RoutedReads::read_head`); `None` when no
    /// bucket overlaps. The page wants at most `left` rows.
    pub(super) async fn read_head(
        &self,
        partition: &PartitionKey,
        (from, to): (EventTime, EventTime),
        req: &BucketScan,
        left: usize,
    ) -> Result<Option<Head>, TableError> {
        let page = page_request(req, req.bounds.clone(), left);
        // Ends at the edge of the supported range bound nothing (every bucket lies inside
        // it); leaving them out keeps the head statement to its index probes.
        let lower = (from > EventTime::min_supported()).then_some(from);
        let upper = (to.as_micros() < EventTime::end_of_supported().as_micros() - 1).then_some(to);
        let read_at = Instant::now();
        let head = self
            .inner
            .store
            .read_head(&self.inner.def.table_id, partition, lower, upper, &page)
            .await?;
        let Some(bucket) = head.bucket else {
            return Ok(None);
        };
        let (first, next) = match head.first {
            HotPage::Missing => (None, None),
            HotPage::Archived { object_key } => {
                let moved = Step::Moved {
                    route: Route::Archived {
                        object_key,
                        read_at,
                    },
                    bounds: req.bounds.clone(),
                    first_of_bucket: true,
                };
                (Some(moved), None)
            }
            // Unlike a later page, an empty first page is still returned: the bucket was
            // read (its page shows in the scan's metrics).
            HotPage::Hot { rows, .. } => {
                let (chunk, next) = page_chunk(rows, &page, true)?;
                (Some(Step::Rows(chunk)), next)
            }
        };
        Ok(Some(Head {
            bucket: bucket.id,
            first,
            next,
        }))
    }
}

/// The page a read asks for next: its bounds, at most `page_rows` and at most the `left`
/// rows the read still wants.
fn page_request(req: &BucketScan, bounds: ScanBounds, left: usize) -> PageRequest {
    PageRequest {
        bounds,
        descending: req.descending,
        limit: req.page_rows.min(left).max(1),
        include_value: req.include_value,
    }
}

/// The one place a hot page's rows (from a page or a head read) become a chunk, with the
/// bounds the bucket's next page starts from: past the page's last row, `None` when the page
/// was short (nothing more matches).
fn page_chunk(
    rows: RecordBatch,
    page: &PageRequest,
    first_of_bucket: bool,
) -> Result<(BucketChunk, Option<ScanBounds>), TableError> {
    let next = if rows.num_rows() >= page.limit {
        last_clustering_key(&rows)
            .map_err(|e| TableError::Store(e.into()))?
            .map(|last| {
                if page.descending {
                    page.bounds.with_before(last)
                } else {
                    page.bounds.with_after(last)
                }
            })
    } else {
        None
    };
    let chunk = BucketChunk {
        tier: Tier::Hot,
        pages: 1,
        buckets: u32::from(first_of_bucket),
        batch: rows,
    };
    Ok((chunk, next))
}
