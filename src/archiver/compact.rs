//! Compaction: rewriting a window's published buckets into segments and moving their routes.
//!
//! A window (a month of day buckets, a year of month buckets) is compacted once every bucket
//! in it is archived with its hot rows deleted and its end is [`ArchiverConfig::compact_after`]
//! in the past. The protocol, in order:
//!
//! 1. claim the window (fresh owner token, generation + 1, a lease by the store's clock);
//! 2. list, a page at a time and in key order, the window's partitions that have work: a
//!    bucket archived and cleaned but still routed to its per-bucket object (the partial
//!    index of the work list answers this, however many partitions are already in
//!    segments); a partition with a bucket not ready yet is left for a later pass, unless
//!    work due at once (masks, a route to a retired segment) waits in its ready buckets:
//!    those are rewritten now, the partition whole once every bucket is ready;
//! 3. per run of partitions up to the segment limits (target bytes, partitions, buckets):
//!    stream every bucket the partitions have in the window, verified (a per-bucket archive
//!    or an older segment), into one segment writer under the claim's generation, which
//!    encodes into a spill file, then uploads (create-once PUT, or a multipart upload under
//!    a unique key), verifies the stored payload by ranges against digests of the rows, and
//!    writes the manifest; memory is bounded by the settings (`docs/segments.md`), not by
//!    the window; the claim's lease is renewed in the background all along;
//! 4. switch that segment's buckets: one transaction that checks the claim and that every
//!    bucket's route is still the source read, moves them, and records the replaced
//!    objects as retired. Each segment is switched as soon as it is written, so a window of
//!    millions of partitions is many bounded transactions, and work done before a crash, a
//!    shutdown or the pass's time budget stays done (those partitions have no work left);
//! 5. release the claim.
//!
//! A crash or a lost lease before a switch leaves only objects nobody references, under a
//! generation no later compaction reuses: garbage collection removes them after its delay.
//! After a switch, the replaced objects stay readable until garbage collection finds them
//! retired for longer than [`ArchiverConfig::retirement_delay`] (every reader's bound on an
//! old route, and the backup retention), so a reader that cached an old route, or a
//! restored hot-store backup, still finds its object. An older segment that other
//! partitions still route to is kept as long as any does.
//!
//! [`ArchiverConfig::compact_after`]: super::ArchiverConfig::compact_after
//! [`ArchiverConfig::retirement_delay`]: super::ArchiverConfig::retirement_delay

use std::time::Instant;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use futures::StreamExt;

use crate::archive::{SegmentSpec, SegmentWriter};
use crate::failpoint;
use crate::model::{BucketKey, EventTime};
use crate::store::{CompactionSource, RouteSwitch, RowMask, StoreError, TableDefinition};

use super::runner::Runner;
use super::sources::{read_source, stream_source, Masks};
use super::window_lease::WindowLease;
use super::ArchiverError;

/// Most partitions in one segment, so its manifest stays a few MiB.
pub const SEGMENT_MAX_PARTITIONS: usize = 16_384;
/// Most buckets in one segment: its switch is one transaction of this many route updates
/// at most, and the switches held until then stay a few MiB.
pub const SEGMENT_MAX_BUCKETS: usize = 32_768;
/// Segments one window claim writes at most (ordinals 0 to 99,998, five digits in the key).
const MAX_SEGMENTS_PER_CLAIM: usize = 99_999;
/// Partitions listed per page of a window's work.
pub const COMPACT_PAGE_PARTITIONS: usize = 1_024;

/// What happened to one window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowOutcome {
    /// Its buckets now route to new segments.
    Compacted {
        /// Segments written.
        segments: usize,
        /// Buckets switched.
        buckets: u64,
        /// Rows rewritten.
        rows: u64,
    },
    /// The pass's time budget ran out inside the window: what is counted was written and
    /// switched; the rest of the window's work is left for the next pass.
    Paused {
        /// Segments written.
        segments: usize,
        /// Buckets switched.
        buckets: u64,
        /// Rows rewritten.
        rows: u64,
    },
    /// Every partition of the window with work has a bucket not archived and cleaned yet.
    NotReady,
    /// Another compactor holds the window.
    Busy,
    /// The window has no work (left).
    Empty,
    /// Shutdown stopped the work: nothing was switched by this attempt after the signal
    /// (segments switched before it stay switched), and the claim was released.
    Interrupted,
}

/// Totals of one compaction pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Windows compacted.
    pub windows: usize,
    /// Segments written.
    pub segments: usize,
    /// Buckets switched to segments.
    pub buckets: u64,
    /// Rows rewritten.
    pub rows: u64,
    /// Windows skipped (not ready or held by another compactor).
    pub skipped: usize,
    /// Windows that failed (their claim was released; orphans are GC's).
    pub failed: usize,
    /// One line per failure.
    pub errors: Vec<String>,
    /// The pass stopped at its time budget with windows left (the next pass resumes there).
    pub budget_spent: bool,
    /// Shutdown stopped the pass (the window in progress was abandoned).
    pub interrupted: bool,
}

impl Runner {
    /// One compaction pass over every table, without a shutdown signal (see
    /// [`Self::compact_pass_until`]).
    pub async fn compact_pass(&self) -> Result<CompactReport, ArchiverError> {
        self.compact_pass_until(&CancellationToken::new()).await
    }

    /// One compaction pass over every table: each window that is due and holds at least
    /// one archived bucket not yet in a segment is compacted, oldest first, table by table.
    /// Due windows are found one index probe each (`Compaction::next_compaction_start`),
    /// jumping from a window's end to the next bucket with work, so windows already in
    /// segments cost nothing however many there are.
    ///
    /// The pass shares the process with archival, cleanup, retention and GC: once it has
    /// run for [`ArchiverConfig::compact_budget`] it writes no new segment (the first
    /// segment is always finished, so every pass makes progress), and the next pass resumes
    /// at the window where this one stopped, so windows late in the order are not starved by
    /// a long backlog before them; inside that window, the partitions already switched have
    /// no work left and are not listed again. `shutdown` stops it at once: the segment in
    /// progress is abandoned (see [`Self::compact_window_until`]) and nothing more is
    /// started.
    ///
    /// [`ArchiverConfig::compact_budget`]: super::ArchiverConfig::compact_budget
    pub async fn compact_pass_until(
        &self,
        shutdown: &CancellationToken,
    ) -> Result<CompactReport, ArchiverError> {
        let started = Instant::now();
        let deadline = started + self.config.compact_budget;
        let mut report = CompactReport::default();
        if shutdown.is_cancelled() {
            report.interrupted = true;
            return Ok(report);
        }
        let now = self.store.now().await?;
        let after = i64::try_from(self.config.compact_after.as_micros()).unwrap_or(i64::MAX);
        // A cutoff before the supported range means no window is due yet.
        let before = EventTime::from_micros(now.as_micros().saturating_sub(after))
            .unwrap_or_else(|_| EventTime::min_supported());
        let mut tables = self.store.tables().await?;
        tables.sort_by(|a, b| a.table_id.cmp(&b.table_id));
        // Resume where the last pass stopped: that table first (at that window), the rest
        // after it; the tables before it wait for the next pass, which starts over.
        let resume = self.compact_cursor.lock().expect("cursor lock").take();
        if let Some((t, _)) = &resume {
            tables.retain(|d| d.table_id >= *t);
        }
        let mut attempted = 0usize;
        for table in tables {
            let mut from = resume
                .as_ref()
                .filter(|(t, _)| *t == table.table_id)
                .map_or_else(EventTime::min_supported, |(_, w)| *w);
            while let Some(first) = self
                .store
                .next_compaction_start(&table.table_id, from, before)
                .await?
            {
                let window = table.strategy.bucket_of(first).window();
                // A window not over by the cutoff is here for its masks only (the store
                // returns such a window only when a bucket of it has masks to rewrite).
                let routes_due = window.end() <= before;
                let stop = if shutdown.is_cancelled() {
                    report.interrupted = true;
                    true
                } else if attempted > 0 && Instant::now() >= deadline {
                    report.budget_spent = true;
                    true
                } else {
                    false
                };
                let cursor = || Some((table.table_id.clone(), window.start()));
                if stop {
                    *self.compact_cursor.lock().expect("cursor lock") = cursor();
                    return Ok(report);
                }
                attempted += 1;
                match self
                    .compact_window_within(&table, window, routes_due, shutdown, Some(deadline))
                    .await
                {
                    Ok(WindowOutcome::Compacted {
                        segments,
                        buckets,
                        rows,
                    }) => {
                        report.windows += 1;
                        report.segments += segments;
                        report.buckets += buckets;
                        report.rows += rows;
                    }
                    Ok(WindowOutcome::Paused {
                        segments,
                        buckets,
                        rows,
                    }) => {
                        report.segments += segments;
                        report.buckets += buckets;
                        report.rows += rows;
                        report.budget_spent = true;
                        *self.compact_cursor.lock().expect("cursor lock") = cursor();
                        return Ok(report);
                    }
                    Ok(WindowOutcome::Interrupted) => {
                        report.interrupted = true;
                        *self.compact_cursor.lock().expect("cursor lock") = cursor();
                        return Ok(report);
                    }
                    Ok(_) => report.skipped += 1,
                    Err(e) => {
                        warn!(table = %table.table_id, %window, error = %e, "compaction failed");
                        self.metrics.compactions_failed.inc();
                        report.failed += 1;
                        report
                            .errors
                            .push(format!("{} {window}: {e}", table.table_id));
                    }
                }
                from = window.end();
            }
        }
        Ok(report)
    }

    /// Compacts one window of one table (see the module comment for the protocol), without
    /// a shutdown signal or time budget.
    pub async fn compact_window(
        &self,
        table: &TableDefinition,
        window: BucketKey,
    ) -> Result<WindowOutcome, ArchiverError> {
        self.compact_window_within(table, window, true, &CancellationToken::new(), None)
            .await
    }

    /// Compacts one window of one table, without a time budget (see
    /// [`Self::compact_window_within`]).
    pub async fn compact_window_until(
        &self,
        table: &TableDefinition,
        window: BucketKey,
        shutdown: &CancellationToken,
    ) -> Result<WindowOutcome, ArchiverError> {
        self.compact_window_within(table, window, true, shutdown, None)
            .await
    }

    /// Compacts one window of one table. When `shutdown` fires first, the work in progress
    /// is dropped where it stands ([`WindowOutcome::Interrupted`]): no request is started
    /// after that, the lease renewal stops, and the claim is released, so another process
    /// may claim the window at once. Dropping is safe at every await point: before a
    /// switch, whatever was written is under a generation no switch will name (GC's orphans
    /// once the claim is released); a switch is one transaction, committed or not. Once
    /// `budget` has passed, the window stops after the segment that is being written
    /// ([`WindowOutcome::Paused`]); one segment is always finished first. With
    /// `routes_due` false (a window not over by the compaction cutoff), only partitions
    /// with masks to rewrite are compacted.
    pub async fn compact_window_within(
        &self,
        table: &TableDefinition,
        window: BucketKey,
        routes_due: bool,
        shutdown: &CancellationToken,
        budget: Option<Instant>,
    ) -> Result<WindowOutcome, ArchiverError> {
        let (start, end) = window.bounds();
        // Nothing to claim for when no partition has work (a resumed window may be done).
        if self
            .store
            .partitions_to_compact(&table.table_id, start, end, None, 1, routes_due)
            .await?
            .is_empty()
        {
            return Ok(WindowOutcome::Empty);
        }
        if shutdown.is_cancelled() {
            return Ok(WindowOutcome::Interrupted);
        }
        let sent = Instant::now();
        let Some(claim) = self
            .store
            .claim_compaction(
                &table.table_id,
                &window.to_string(),
                start,
                end,
                self.config.lease,
            )
            .await?
        else {
            return Ok(WindowOutcome::Busy);
        };
        failpoint::hit("compact_after_claim");
        let lease = WindowLease::start(
            self.store.clone(),
            claim,
            sent,
            self.config.lease,
            self.config.op_deadline,
        );
        let result = tokio::select! {
            biased;
            () = shutdown.cancelled() => {
                info!(table = %table.table_id, %window, "compaction abandoned at shutdown");
                Ok(WindowOutcome::Interrupted)
            }
            r = async {
                // The window's directory is noted before a segment is written there, so
                // GC's incremental passes look at what an unfinished compaction leaves.
                self.store
                    .note_gc_prefix(&self.archive.segments_prefix(&table.table_id, &window.to_string()))
                    .await?;
                self.compact_claimed(table, window, routes_due, &lease, budget).await
            } => r,
        };
        // Best effort: a claim that is not released expires with its lease.
        let current = lease.claim();
        drop(lease);
        if let Err(e) = self.store.release_compaction(&current).await {
            warn!(error = %e, "releasing a compaction claim failed; it expires with its lease");
        }
        result
    }

    async fn compact_claimed(
        &self,
        table: &TableDefinition,
        window: BucketKey,
        routes_due: bool,
        lease: &WindowLease,
        budget: Option<Instant>,
    ) -> Result<WindowOutcome, ArchiverError> {
        let (start, end) = window.bounds();
        let mut done = Totals::default();
        let mut not_ready = 0usize;
        // Sources are read through a store that caches no decoded rows, so what this holds
        // is bounded by the settings, not by the window.
        let archive = self.archive.with_segment_cache_bytes(0);
        // A declared table's segments are columnar, at its newest schema (read once per
        // claim: a window's segments share one layout).
        let layout = self.layout_for(&table.table_id).await;
        let mut batch: Option<SegmentBatch> = None;
        let mut after: Option<crate::model::PartitionKey> = None;
        loop {
            // The partitions with work, a page at a time, listed after the claim; the
            // sources of a page are read in one snapshot, and each switch re-checks them.
            let page = self
                .store
                .partitions_to_compact(
                    &table.table_id,
                    start,
                    end,
                    after.as_ref(),
                    self.config.compact_page_partitions.max(1),
                    routes_due,
                )
                .await?;
            let Some(last) = page.last().cloned() else {
                break;
            };
            after = Some(last);
            let state = self
                .store
                .partition_sources(&table.table_id, start, end, &page)
                .await?;
            not_ready += state.not_ready.len();
            let sources = state.sources;
            // Sources are opened a few ahead, in order (their manifests and footers, a few
            // KiB each: object-store latency dominates); their rows are streamed, batch by
            // batch, only when the segment writer reaches them. The sorted stream of a
            // partition is the concatenation of its sources: they are its buckets in bucket
            // order (time-disjoint), each sorted by `(event_time, sort_key)`; the writer
            // refuses any row out of order. (The futures are made up front: a stream
            // closure returning borrowing futures would not be `Send` for every lifetime,
            // which `tokio::spawn` of the runner needs.)
            let pending: Vec<_> = sources
                .iter()
                .map(|src| read_source(&archive, src))
                .collect();
            let mut opened =
                futures::stream::iter(pending).buffered(self.config.concurrency.max(1) * 2);
            let mut i = 0;
            while i < sources.len() {
                // One partition's sources: a partition never spans segments.
                let pk = &sources[i].bucket.partition_key;
                let b = match &mut batch {
                    Some(b) => b,
                    None => {
                        // Segment keys hold five-digit ordinals (the shape that tells a
                        // segment from a per-bucket object): a claim that has written that
                        // many stops, and the next pass goes on under a new generation.
                        if done.segments >= MAX_SEGMENTS_PER_CLAIM {
                            return Ok(done.paused());
                        }
                        // A lost claim stops the work before anything more is written
                        // under it (the switch would refuse it anyway).
                        lease.check()?;
                        let spec = SegmentSpec {
                            table_id: table.table_id.clone(),
                            strategy: table.strategy,
                            window,
                            generation: lease.claim().generation,
                            ordinal: u32::try_from(done.segments).unwrap_or(u32::MAX),
                        };
                        let writer = self.archive.segment_writer_with(
                            &spec,
                            &self.config.segment_upload(),
                            layout.clone(),
                        )?;
                        batch.insert(SegmentBatch {
                            writer,
                            sources: Vec::new(),
                            empty: Vec::new(),
                            purged: Vec::new(),
                        })
                    }
                };
                let mut j = i;
                while j < sources.len() && &sources[j].bucket.partition_key == pk {
                    let src = &sources[j];
                    let (rows, expected) = opened.next().await.expect("one read per source")?;
                    // Masks are read after the source is opened, as a query reads them
                    // after its route: a mask written later is left for the next rewrite
                    // (it still applies to the new segment's rows).
                    let masks = if src.masked {
                        self.store.row_masks(&src.bucket).await?
                    } else {
                        Vec::new()
                    };
                    let (got, kept) =
                        stream_source(rows, src, &Masks::new(&masks), &mut b.writer).await?;
                    if got != expected {
                        return Err(ArchiverError::Unresolved {
                            bucket: src.bucket.clone(),
                            step: "compaction",
                            detail: format!(
                                "its archive yielded {got} rows, its manifest says {expected}"
                            ),
                        });
                    }
                    if !masks.is_empty() {
                        b.purged.push((src.bucket.clone(), masks));
                    }
                    // Archived buckets without rows (or with every row deleted) are removed
                    // instead (see `drop_empty_buckets`): a segment lists only buckets with
                    // rows, and an empty bucket left on its old route would bring the window
                    // back every pass.
                    if kept == 0 {
                        b.empty.push(src.clone());
                    } else {
                        b.sources.push(src.clone());
                    }
                    j += 1;
                }
                i = j;
                // A segment is closed at the partition boundary where it reaches a limit.
                let full = b.writer.input_bytes() >= self.config.segment_target_bytes as u64
                    || b.writer.partitions() >= self.config.segment_max_partitions.max(1)
                    || b.sources.len() + b.empty.len() >= SEGMENT_MAX_BUCKETS;
                if full {
                    let b = batch.take().expect("a batch is open");
                    self.finish_batch(table, window, lease, b, &mut done)
                        .await?;
                    if budget.is_some_and(|d| Instant::now() >= d) {
                        info!(table = %table.table_id, %window, "compaction paused at its time budget");
                        return Ok(done.paused());
                    }
                }
            }
        }
        if let Some(b) = batch.take() {
            self.finish_batch(table, window, lease, b, &mut done)
                .await?;
        }
        if done.segments == 0 && done.buckets == 0 && not_ready > 0 {
            return Ok(WindowOutcome::NotReady);
        }
        info!(
            table = %table.table_id,
            %window,
            segments = done.segments,
            buckets = done.buckets,
            rows = done.rows,
            not_ready_partitions = not_ready,
            generation = lease.claim().generation,
            "window compacted"
        );
        Ok(done.compacted())
    }

    /// Writes one segment (upload, verification by ranges, manifest) unless it holds no
    /// rows, removes its empty buckets, and switches the rest of its buckets to it.
    async fn finish_batch(
        &self,
        table: &TableDefinition,
        window: BucketKey,
        lease: &WindowLease,
        batch: SegmentBatch,
        done: &mut Totals,
    ) -> Result<(), ArchiverError> {
        let SegmentBatch {
            writer,
            sources,
            empty,
            purged,
        } = batch;
        let rows = writer.rows();
        // (A batch of partitions whose every bucket was empty holds no rows and writes
        // nothing.)
        let (switches, segment_key) = if rows > 0 {
            lease.check()?;
            let s = self.write_batch(writer, sources).await?;
            done.segments += 1;
            let key = s.first().map(|s| s.to_object_key.clone());
            (s, key)
        } else {
            (Vec::new(), None)
        };
        failpoint::hit("compact_before_switch");
        lease.check()?;
        let claim = lease.claim();
        if !empty.is_empty() {
            let dropped = self.store.drop_empty_buckets(&claim, &empty).await?;
            info!(table = %table.table_id, %window, buckets = dropped, "empty archived buckets removed");
        }
        if !switches.is_empty() {
            let switched = self.store.switch_routes(&claim, &switches).await?;
            failpoint::hit("compact_after_switch");
            self.metrics.buckets_compacted.inc_by(switched);
            done.buckets += switched;
            done.rows += rows;
        }
        // Only after the switch: a mask marked rewritten is forgotten by garbage collection
        // once no reader can hold the old route, so it must never be marked while its rows
        // are still in the routed object. (Dropped buckets had theirs marked with the drop.)
        // A crash before this leaves the masks unmarked: the partition is rewritten again.
        for (bucket, masks) in &purged {
            if empty.iter().any(|e| e.bucket == *bucket) {
                self.metrics.masks_purged.inc_by(masks.len() as u64);
            } else if let Some(key) = &segment_key {
                let marked = self.store.mark_masks_purged(bucket, key, masks).await?;
                self.metrics.masks_purged.inc_by(marked);
            }
        }
        Ok(())
    }

    /// Finishes one segment (upload, verification by ranges, manifest); returns its
    /// sources' switches.
    async fn write_batch(
        &self,
        writer: SegmentWriter,
        sources: Vec<CompactionSource>,
    ) -> Result<Vec<RouteSwitch>, ArchiverError> {
        // Transient failures are retried request by request inside; the rows are not held,
        // so the segment is not rewritten as a whole.
        let written = writer.finish().await?;
        self.metrics.segments_written.inc();
        self.metrics
            .bytes_compacted
            .inc_by(written.manifest.byte_length);
        let held = written.manifest.buckets().count() as u64;
        Ok(sources
            .into_iter()
            .map(|s| RouteSwitch {
                bucket: s.bucket,
                from_object_key: s.object_key,
                to_object_key: written.manifest_key.clone(),
                to_buckets: Some(held),
            })
            .collect())
    }
}

/// What a window's compaction has written and switched so far.
#[derive(Debug, Default)]
struct Totals {
    segments: usize,
    buckets: u64,
    rows: u64,
}

impl Totals {
    fn compacted(&self) -> WindowOutcome {
        WindowOutcome::Compacted {
            segments: self.segments,
            buckets: self.buckets,
            rows: self.rows,
        }
    }

    fn paused(&self) -> WindowOutcome {
        WindowOutcome::Paused {
            segments: self.segments,
            buckets: self.buckets,
            rows: self.rows,
        }
    }
}

/// The segment being filled: its writer (rows already encoded into its spill file) and
/// the sources whose rows it holds.
struct SegmentBatch {
    writer: SegmentWriter,
    sources: Vec<CompactionSource>,
    /// Buckets whose archive holds no rows (masks applied): removed, not switched.
    empty: Vec<CompactionSource>,
    /// The masks applied to each bucket's rows, to mark rewritten once switched.
    purged: Vec<(crate::model::BucketId, Vec<RowMask>)>,
}

/// Whether a store error means the compaction lost its window or a route moved under it
/// (expected under concurrency; the next pass looks again).
pub fn is_contention(e: &ArchiverError) -> bool {
    matches!(
        e,
        ArchiverError::Store(StoreError::StaleCompaction { .. } | StoreError::RouteChanged { .. })
    )
}
