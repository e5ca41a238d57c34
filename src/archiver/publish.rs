//! Publication: the archival work item after its claim. The fenced snapshot streams into the
//! archive writer while a heartbeat keeps the lease; the verified archive is published in one
//! conditional transaction, and an ambiguous publication is settled by re-reading the route.
//! Nothing is written once the lease is lost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::archive::WriteError;
use crate::failpoint;
use crate::model::{ClusteringKey, Record};
use crate::store::{BucketState, Claim, HotStore, StoreError};

use super::lease::LeaseKeeper;
use super::runner::BucketOutcome;
use super::{ArchiverError, Runner};

/// Publication attempts before its outcome is reported unresolved.
const PUBLISH_ATTEMPTS: u32 = 5;

/// Pause before publication attempt `attempt` (from 1).
fn publish_backoff(attempt: u32) -> Duration {
    Duration::from_millis(100 << attempt)
}

/// The longest publication can take after the upload: every attempt and its re-read at the
/// operation deadline, plus the pauses between attempts. Part of the GC delay's floor.
pub(crate) fn publication_window(op_deadline: Duration) -> Duration {
    let pauses: Duration = (1..PUBLISH_ATTEMPTS).map(publish_backoff).sum();
    op_deadline
        .saturating_mul(2 * PUBLISH_ATTEMPTS)
        .saturating_add(pauses)
}

impl Runner {
    pub(super) fn keep_lease(&self, claim: Claim, sent: Instant) -> LeaseKeeper {
        LeaseKeeper::start(
            self.store.clone(),
            claim,
            sent,
            self.config.lease,
            self.config.op_deadline,
        )
    }

    pub(super) async fn archive_claimed(
        &self,
        claim: Claim,
        sent: Instant,
        shutdown: &CancellationToken,
    ) -> Result<BucketOutcome, ArchiverError> {
        let started = Instant::now();
        let keeper = self.keep_lease(claim.clone(), sent);
        let pages = snapshot_pages(
            self.store.clone(),
            claim.clone(),
            self.config.snapshot_page_rows,
            self.config.op_deadline,
        );
        let format = self.format_for(&claim.bucket.table_id);
        let layout = self.layout_for(&claim.bucket.table_id).await;
        // The generation's directory is noted before anything is written there, so GC's
        // incremental passes look at it if this attempt never publishes.
        let noted = match self
            .store
            .note_gc_prefix(
                &self
                    .archive
                    .generation_prefix(&claim.bucket, claim.generation),
            )
            .await
        {
            Ok(noted) => noted,
            Err(e) => {
                let reason = format!("could not note the upload for garbage collection: {e}");
                self.defer(&claim, reason.clone(), self.config.retry).await;
                return Ok(BucketOutcome::Deferred { reason });
            }
        };
        let upload = self.archive.write_bucket_with(
            &claim.bucket,
            claim.generation,
            format,
            layout.as_ref(),
            pages,
        );
        let written = tokio::select! {
            biased;
            _ = keeper.lost.cancelled() => return Ok(BucketOutcome::LeaseLost),
            _ = shutdown.cancelled() => {
                // Hand the bucket back at once rather than keep the process alive for an
                // upload that may take minutes; the dropped upload leaves only orphans.
                self.defer(&claim, "archiver shutting down".into(), Duration::ZERO).await;
                return Ok(BucketOutcome::Interrupted);
            }
            r = tokio::time::timeout(self.config.upload_deadline, upload) => match r {
                Ok(Ok(w)) => w,
                Ok(Err(e)) => {
                    let reason = match e {
                        WriteError::Source(StoreError::StaleClaim { .. }) => {
                            return Ok(BucketOutcome::LeaseLost)
                        }
                        WriteError::Source(se) => format!("snapshot failed: {se}"),
                        WriteError::Archive(e) => format!("upload failed: {e}"),
                    };
                    self.defer(&claim, reason.clone(), self.config.retry).await;
                    return Ok(BucketOutcome::Deferred { reason });
                }
                Err(_) => {
                    let reason = "upload deadline passed".to_string();
                    self.defer(&claim, reason.clone(), self.config.retry).await;
                    return Ok(BucketOutcome::Deferred { reason });
                }
            },
        };
        failpoint::hit("after_verify");
        info!(
            key = %written.manifest_key,
            rows = written.manifest.row_count,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "snapshotted, uploaded and verified"
        );
        if !keeper.holds() {
            return Ok(BucketOutcome::LeaseLost);
        }
        if !self.publish(&claim, &written.manifest_key).await? {
            return Ok(BucketOutcome::LeaseLost);
        }
        failpoint::hit("after_publish");
        // Published: everything in the directory is routed now, so GC need not look at it.
        // Best effort (a pass that finds it routed forgets it too).
        if let Err(e) = self.store.forget_gc_prefixes(&[noted]).await {
            debug!(error = %e, "published bucket's directory stays noted for GC");
        }
        self.metrics.buckets_archived.inc();
        self.metrics
            .rows_archived
            .inc_by(written.manifest.row_count);
        self.metrics
            .bytes_archived
            .inc_by(written.manifest.byte_length);
        info!(key = %written.manifest_key, elapsed_ms = started.elapsed().as_millis() as u64, "published");
        Ok(BucketOutcome::Archived {
            rows: written.manifest.row_count,
            bytes: written.manifest.byte_length,
        })
    }

    /// Publishes, settling an ambiguous result by re-reading the route. `Ok(false)` when the
    /// claim turned out not to be current (nothing was published under it).
    async fn publish(&self, claim: &Claim, manifest_key: &str) -> Result<bool, ArchiverError> {
        let mut last_error = None;
        for attempt in 0..PUBLISH_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(publish_backoff(attempt)).await;
            }
            // The store answered that the conditional update matched nothing: definitive,
            // unless an earlier attempt's commit is what changed the row (the re-read tells).
            let mut refused = false;
            match tokio::time::timeout(
                self.config.op_deadline,
                self.store.publish_archive(claim, manifest_key),
            )
            .await
            {
                Ok(Ok(())) => return Ok(true),
                Ok(Err(e @ StoreError::StaleClaim { .. })) => {
                    refused = true;
                    last_error = Some(e.to_string());
                }
                Ok(Err(e)) => last_error = Some(e.to_string()),
                Err(_) => last_error = Some("publish deadline passed".into()),
            }
            // The commit may have happened even though we saw an error: ask the authority.
            match tokio::time::timeout(self.config.op_deadline, self.store.bucket(&claim.bucket))
                .await
            {
                Ok(Ok(Some(meta))) => match meta.state {
                    BucketState::Archived { object_key, .. } if object_key == manifest_key => {
                        return Ok(true)
                    }
                    // Still ours by token and generation, so the update was refused for the
                    // lease alone: it expired.
                    BucketState::Archiving
                        if meta.generation == claim.generation
                            && meta.owner_token.as_deref() == Some(claim.token.as_str()) =>
                    {
                        if refused {
                            return Ok(false);
                        }
                    }
                    _ => return Ok(false),
                },
                Ok(Ok(None)) => return Ok(false),
                Ok(Err(e)) => last_error = Some(e.to_string()),
                Err(_) => last_error = Some("re-read deadline passed".into()),
            }
        }
        Err(ArchiverError::Unresolved {
            bucket: claim.bucket.clone(),
            step: "publish",
            detail: last_error.unwrap_or_default(),
        })
    }
}

/// The fenced snapshot as a stream of pages for the archive writer. The next page is
/// fetched while the writer encodes the current one, so the database and the encoder work
/// at the same time. A store error comes back from the writer as it was
/// ([`WriteError::Source`]), so the runner tells a lost claim from a transient failure.
fn snapshot_pages(
    store: Arc<dyn HotStore>,
    claim: Claim,
    page_rows: usize,
    deadline: Duration,
) -> impl futures::Stream<Item = Result<Vec<Record>, StoreError>> + Send + 'static {
    type Fetch = tokio::task::JoinHandle<Result<Vec<Record>, StoreError>>;
    let fetch = {
        let (store, claim) = (store.clone(), claim.clone());
        move |after: Option<ClusteringKey>| -> Fetch {
            let (store, claim) = (store.clone(), claim.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(
                    deadline,
                    store.snapshot_page(&claim, after.as_ref(), page_rows),
                )
                .await
                {
                    Ok(r) => r,
                    Err(_) => Err(StoreError::Backend {
                        operation: "snapshot",
                        detail: "snapshot page deadline passed".into(),
                    }),
                }
            })
        }
    };
    /// Aborts a prefetch nobody will read (the writer stopped or the work was dropped).
    struct Pending(Option<Fetch>);
    impl Drop for Pending {
        fn drop(&mut self) {
            if let Some(h) = self.0.take() {
                h.abort();
            }
        }
    }
    let first = Pending(Some(fetch(None)));
    stream::try_unfold((first, 0u64), move |(mut pending, page_no)| {
        let fetch = fetch.clone();
        async move {
            let Some(handle) = pending.0.take() else {
                return Ok(None);
            };
            if page_no == 1 {
                // The first page has been handed to the writer: we are mid-upload.
                failpoint::hit("mid_upload");
            }
            let page = match handle.await {
                Ok(page) => page?,
                Err(e) => {
                    return Err(StoreError::Backend {
                        operation: "snapshot",
                        detail: format!("snapshot task failed: {e}"),
                    })
                }
            };
            if page_no == 0 {
                failpoint::hit("mid_snapshot");
            }
            if page.is_empty() {
                return Ok(None);
            }
            if page.len() >= page_rows {
                pending.0 = Some(fetch(page.last().map(Record::clustering_key)));
            }
            Ok(Some((page, (pending, page_no + 1))))
        }
    })
}
