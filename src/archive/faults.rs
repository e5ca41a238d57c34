//! A fault-injecting OpenDAL layer for tests and chaos runs: fail the first N calls of chosen
//! operations or a seeded random fraction of them, report a committed write as failed (the
//! "outcome unknown" case retries must resolve), flip a byte in read data, and add latency.
//! Write-side faults damage what reaches the store while the caller is told all is well (a
//! flipped bit, a truncated object, a dropped chunk, a write that stores nothing), and a store
//! can be made to ignore create-if-absent: the archive's read-back verification and its
//! start-up probe must catch each of these.
//!
//! It is a real [`opendal::raw::Layer`], so the archive code under test runs unchanged on top
//! of it: `ArchiveStore::with_faults(FaultLayer::new(plan))`, or `op.layer(layer)` directly.
//! Injected errors are temporary `Unexpected` errors, as a flaky network produces them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opendal::raw::oio;
use opendal::raw::{
    Layer, OpCopier, OpCopy, OpCreateDir, OpDelete, OpList, OpPresign, OpRead, OpRename, OpStat,
    OpWrite, RpCreateDir, RpPresign, RpRead, RpRename, RpStat, Service, ServiceInfo, Servicer,
};
use opendal::{
    Buffer, BytesRange, Capability, EntryMode, Error, ErrorKind, Metadata, OperationContext, Result,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The operations a plan can disturb.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultOp {
    /// Writer chunks and closes (payload and manifest uploads).
    Write,
    /// Reads: whole, ranged and streamed chunks.
    Read,
    /// Metadata lookups.
    Stat,
    /// Listing pages.
    List,
    /// Deletions.
    Delete,
}

const OPS: usize = 5;

impl FaultOp {
    fn idx(self) -> usize {
        match self {
            Self::Write => 0,
            Self::Read => 1,
            Self::Stat => 2,
            Self::List => 3,
            Self::Delete => 4,
        }
    }
}

/// Damage done to a write that still reports success (see [`FaultPlan::damage_writes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriteFault {
    /// One bit flipped in the middle of the first chunk.
    FlipBit,
    /// The last chunk loses its second half.
    Truncate,
    /// The first chunk never reaches the store (a lost part; a one-chunk write stores an
    /// empty object).
    DropChunk,
    /// Nothing is stored: chunks are discarded and the upload aborted, yet the close reports
    /// success. (On a filesystem the create already made an empty file, which stays.)
    Vanish,
}

/// What to inject. Built with the `#[must_use]` builder methods; the default injects nothing.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    fail_first: [u64; OPS],
    fail_ratio: [f64; OPS],
    ambiguous_writes: u64,
    corrupt_read_ratio: f64,
    latency: Duration,
    seed: u64,
    damage: Option<(WriteFault, String)>,
    ignore_conditions: bool,
    fail_closes: u64,
}

impl FaultPlan {
    /// An empty plan whose random choices derive from `seed` (runs are reproducible).
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            ..Self::default()
        }
    }

    /// Fail the first `n` calls of `op`.
    #[must_use]
    pub fn fail_first(mut self, op: FaultOp, n: u64) -> Self {
        self.fail_first[op.idx()] = n;
        self
    }

    /// Fail each later call of `op` with probability `ratio`.
    #[must_use]
    pub fn fail_ratio(mut self, op: FaultOp, ratio: f64) -> Self {
        self.fail_ratio[op.idx()] = ratio.clamp(0.0, 1.0);
        self
    }

    /// The first `n` writes that commit report failure anyway (the response was "lost").
    #[must_use]
    pub fn ambiguous_writes(mut self, n: u64) -> Self {
        self.ambiguous_writes = n;
        self
    }

    /// Flip one byte of a read result with probability `ratio`.
    #[must_use]
    pub fn corrupt_reads(mut self, ratio: f64) -> Self {
        self.corrupt_read_ratio = ratio.clamp(0.0, 1.0);
        self
    }

    /// Damage every write whose path contains `path_contains` (`""`: every write) with
    /// `fault`, and report it successful.
    #[must_use]
    pub fn damage_writes(mut self, fault: WriteFault, path_contains: &str) -> Self {
        self.damage = Some((fault, path_contains.to_string()));
        self
    }

    /// Fail the first `n` writer closes before they reach the store, after every chunk was
    /// accepted (a multipart completion that fails: the upload is left open).
    #[must_use]
    pub fn fail_closes(mut self, n: u64) -> Self {
        self.fail_closes = n;
        self
    }

    /// Drop the create-if-absent condition from every write while still advertising it: a
    /// store that silently overwrites, which the start-up probe must refuse.
    #[must_use]
    pub fn ignore_create_conditions(mut self) -> Self {
        self.ignore_conditions = true;
        self
    }

    /// Delay every disturbed call by `d`.
    #[must_use]
    pub fn latency(mut self, d: Duration) -> Self {
        self.latency = d;
        self
    }
}

/// What a layer has injected so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultStats {
    /// Calls seen per operation (`FaultOp` order: write, read, stat, list, delete).
    pub calls: [u64; OPS],
    /// Calls failed on purpose.
    pub failures: u64,
    /// Committed writes reported as failed.
    pub ambiguous_writes: u64,
    /// Read results with a flipped byte.
    pub corrupted_reads: u64,
    /// Writes damaged by a [`WriteFault`] (counted when the damage is done).
    pub damaged_writes: u64,
}

#[derive(Debug)]
struct FaultState {
    plan: FaultPlan,
    calls: [AtomicU64; OPS],
    failures: AtomicU64,
    ambiguous: AtomicU64,
    corrupted: AtomicU64,
    damaged: AtomicU64,
    closes: AtomicU64,
    rng: Mutex<StdRng>,
}

impl FaultState {
    fn roll(&self, p: f64) -> bool {
        p > 0.0 && self.rng.lock().expect("fault rng lock").random::<f64>() < p
    }

    async fn gate(&self, op: FaultOp) -> Result<()> {
        if !self.plan.latency.is_zero() {
            tokio::time::sleep(self.plan.latency).await;
        }
        let i = op.idx();
        let n = self.calls[i].fetch_add(1, Ordering::SeqCst);
        if n < self.plan.fail_first[i] || self.roll(self.plan.fail_ratio[i]) {
            self.failures.fetch_add(1, Ordering::SeqCst);
            return Err(Error::new(ErrorKind::Unexpected, "injected fault")
                .with_context("fault", format!("{op:?} call {n}"))
                .set_temporary());
        }
        Ok(())
    }

    fn ambiguous_now(&self) -> bool {
        self.ambiguous
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                (used < self.plan.ambiguous_writes).then_some(used + 1)
            })
            .is_ok()
    }

    fn maybe_corrupt(&self, buf: Buffer) -> Buffer {
        if buf.is_empty() || !self.roll(self.plan.corrupt_read_ratio) {
            return buf;
        }
        self.corrupted.fetch_add(1, Ordering::SeqCst);
        let mut v = buf.to_vec();
        let at = v.len() / 2;
        v[at] ^= 0x5a;
        Buffer::from(v)
    }
}

/// The layer. Cloning shares the counters, so a test can keep one handle for [`Self::stats`].
#[derive(Debug, Clone)]
pub struct FaultLayer {
    state: Arc<FaultState>,
}

impl FaultLayer {
    /// A layer that executes `plan`.
    pub fn new(plan: FaultPlan) -> Self {
        let seed = plan.seed;
        Self {
            state: Arc::new(FaultState {
                plan,
                calls: Default::default(),
                failures: AtomicU64::new(0),
                ambiguous: AtomicU64::new(0),
                corrupted: AtomicU64::new(0),
                damaged: AtomicU64::new(0),
                closes: AtomicU64::new(0),
                rng: Mutex::new(StdRng::seed_from_u64(seed)),
            }),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> FaultStats {
        let s = &self.state;
        let mut calls = [0; OPS];
        for (c, a) in calls.iter_mut().zip(s.calls.iter()) {
            *c = a.load(Ordering::SeqCst);
        }
        FaultStats {
            calls,
            failures: s.failures.load(Ordering::SeqCst),
            ambiguous_writes: s.ambiguous.load(Ordering::SeqCst),
            corrupted_reads: s.corrupted.load(Ordering::SeqCst),
            damaged_writes: s.damaged.load(Ordering::SeqCst),
        }
    }
}

impl Layer for FaultLayer {
    fn apply_service(&self, inner: Servicer) -> Servicer {
        Arc::new(FaultService {
            inner,
            state: self.state.clone(),
        })
    }
}

#[doc(hidden)]
#[derive(Debug)]
pub struct FaultService {
    inner: Servicer,
    state: Arc<FaultState>,
}

#[doc(hidden)]
pub struct Faulty<R> {
    inner: R,
    state: Arc<FaultState>,
}

impl Service for FaultService {
    type Reader = Faulty<oio::Reader>;
    type Writer = FaultyWriter<oio::Writer>;
    type Lister = Faulty<oio::Lister>;
    type Deleter = Faulty<oio::Deleter>;
    type Copier = oio::Copier;

    fn info(&self) -> ServiceInfo {
        self.inner.info()
    }

    fn capability(&self) -> Capability {
        self.inner.capability()
    }

    async fn create_dir(
        &self,
        ctx: &OperationContext,
        path: &str,
        args: OpCreateDir,
    ) -> Result<RpCreateDir> {
        self.inner.create_dir(ctx, path, args).await
    }

    async fn stat(&self, ctx: &OperationContext, path: &str, args: OpStat) -> Result<RpStat> {
        self.state.gate(FaultOp::Stat).await?;
        self.inner.stat(ctx, path, args).await
    }

    fn read(&self, ctx: &OperationContext, path: &str, args: OpRead) -> Result<Self::Reader> {
        let inner = self.inner.read(ctx, path, args)?;
        Ok(Faulty {
            inner,
            state: self.state.clone(),
        })
    }

    fn write(&self, ctx: &OperationContext, path: &str, args: OpWrite) -> Result<Self::Writer> {
        let args = if self.state.plan.ignore_conditions {
            args.with_if_not_exists(false)
        } else {
            args
        };
        let damage = match &self.state.plan.damage {
            Some((fault, filter)) if path.contains(filter.as_str()) => Some(*fault),
            _ => None,
        };
        let inner = self.inner.write(ctx, path, args)?;
        Ok(FaultyWriter {
            inner,
            state: self.state.clone(),
            damage,
            chunks: 0,
            held: None,
        })
    }

    fn delete(&self, ctx: &OperationContext) -> Result<Self::Deleter> {
        let inner = self.inner.delete(ctx)?;
        Ok(Faulty {
            inner,
            state: self.state.clone(),
        })
    }

    fn list(&self, ctx: &OperationContext, path: &str, args: OpList) -> Result<Self::Lister> {
        let inner = self.inner.list(ctx, path, args)?;
        Ok(Faulty {
            inner,
            state: self.state.clone(),
        })
    }

    fn copy(
        &self,
        ctx: &OperationContext,
        from: &str,
        to: &str,
        args: OpCopy,
        opts: OpCopier,
    ) -> Result<Self::Copier> {
        self.inner.copy(ctx, from, to, args, opts)
    }

    async fn rename(
        &self,
        ctx: &OperationContext,
        from: &str,
        to: &str,
        args: OpRename,
    ) -> Result<RpRename> {
        self.inner.rename(ctx, from, to, args).await
    }

    async fn presign(
        &self,
        ctx: &OperationContext,
        path: &str,
        args: OpPresign,
    ) -> Result<RpPresign> {
        self.inner.presign(ctx, path, args).await
    }
}

impl<R: oio::ReadStream> oio::ReadStream for Faulty<R> {
    async fn read(&mut self) -> Result<Buffer> {
        self.state.gate(FaultOp::Read).await?;
        let buf = self.inner.read().await?;
        Ok(self.state.maybe_corrupt(buf))
    }
}

impl<R: oio::Read> oio::Read for Faulty<R> {
    async fn open(&self, range: BytesRange) -> Result<(RpRead, Box<dyn oio::ReadStreamDyn>)> {
        self.state.gate(FaultOp::Read).await?;
        let (rp, stream) = self.inner.open(range).await?;
        Ok((
            rp,
            Box::new(Faulty {
                inner: stream,
                state: self.state.clone(),
            }) as Box<dyn oio::ReadStreamDyn>,
        ))
    }

    async fn read(&self, range: BytesRange) -> Result<(RpRead, Buffer)> {
        self.state.gate(FaultOp::Read).await?;
        let (rp, buf) = self.inner.read(range).await?;
        Ok((rp, self.state.maybe_corrupt(buf)))
    }
}

#[doc(hidden)]
pub struct FaultyWriter<W> {
    inner: W,
    state: Arc<FaultState>,
    damage: Option<WriteFault>,
    /// Chunks handed to this writer so far.
    chunks: u64,
    /// [`WriteFault::Truncate`] holds each chunk back until it knows whether it is the last.
    held: Option<Buffer>,
}

impl<W: oio::Write> FaultyWriter<W> {
    fn damaged(&self) {
        self.state.damaged.fetch_add(1, Ordering::SeqCst);
    }

    /// Passes one chunk on, damaged as the plan says.
    async fn forward(&mut self, bs: Buffer) -> Result<()> {
        let first = self.chunks == 0;
        self.chunks += 1;
        match self.damage {
            None => self.inner.write(bs).await,
            Some(WriteFault::FlipBit) if first && !bs.is_empty() => {
                self.damaged();
                let mut v = bs.to_vec();
                let at = v.len() / 2;
                v[at] ^= 0x01;
                self.inner.write(Buffer::from(v)).await
            }
            Some(WriteFault::DropChunk) if first => {
                self.damaged();
                Ok(())
            }
            Some(WriteFault::Vanish) => Ok(()),
            Some(WriteFault::Truncate) => {
                if let Some(prev) = self.held.replace(bs) {
                    self.inner.write(prev).await?;
                }
                Ok(())
            }
            Some(_) => self.inner.write(bs).await,
        }
    }
}

impl<W: oio::Write> oio::Write for FaultyWriter<W> {
    async fn write(&mut self, bs: Buffer) -> Result<()> {
        self.state.gate(FaultOp::Write).await?;
        self.forward(bs).await
    }

    async fn close(&mut self) -> Result<Metadata> {
        self.state.gate(FaultOp::Write).await?;
        if self.state.closes.fetch_add(1, Ordering::SeqCst) < self.state.plan.fail_closes {
            self.state.failures.fetch_add(1, Ordering::SeqCst);
            // Chunks still held by this layer are written first, so the backend has its
            // upload open with everything but the completion.
            if let Some(held) = self.held.take() {
                self.inner.write(held).await?;
            }
            return Err(
                Error::new(ErrorKind::Unexpected, "injected fault: close failed").set_temporary(),
            );
        }
        if self.damage == Some(WriteFault::Vanish) {
            self.damaged();
            // Whatever the backend began (a multipart upload, a temp file) goes away.
            let _ = self.inner.abort().await;
            return Ok(Metadata::new(EntryMode::FILE));
        }
        if let Some(mut last) = self.held.take() {
            self.damaged();
            last.truncate(last.len() / 2);
            self.inner.write(last).await?;
        }
        let meta = self.inner.close().await?;
        if self.state.ambiguous_now() {
            return Err(Error::new(
                ErrorKind::Unexpected,
                "injected fault: the write committed but its response was lost",
            )
            .set_temporary());
        }
        Ok(meta)
    }

    async fn abort(&mut self) -> Result<()> {
        self.held = None;
        self.inner.abort().await
    }
}

impl<L: oio::List> oio::List for Faulty<L> {
    async fn next(&mut self) -> Result<Option<oio::Entry>> {
        self.state.gate(FaultOp::List).await?;
        self.inner.next().await
    }
}

impl<D: oio::Delete> oio::Delete for Faulty<D> {
    async fn delete(&mut self, path: &str, args: OpDelete) -> Result<()> {
        self.state.gate(FaultOp::Delete).await?;
        self.inner.delete(path, args).await
    }

    async fn close(&mut self) -> Result<()> {
        self.inner.close().await
    }
}
