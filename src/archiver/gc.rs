//! Orphan garbage collection for the archive prefix.
//!
//! An object is deleted only when no published route references its generation directory,
//! no in-flight claim holds that generation, and it is older than the safety delay. The
//! reads come in one order, each after the last: the object listing, then the in-flight
//! claims, then the published routes. A generation only ever moves forward from Archiving to
//! Archived (publication keeps its key for good), so a generation claimed when the claims
//! are read is either still claimed then or published by the time the routes are read:
//! reading the routes first would let a publication that lands between the two reads slip
//! through both. Objects written after the listing are not candidates at all, ages are
//! measured from before the listing, and anything without a modification time is kept
//! (leak rather than delete when unsure). The delay itself is a second, independent guard:
//! [`super::ArchiverConfig::min_gc_delay`] keeps it above the longest time a generation can
//! wait for its publication.
//!
//! Compaction adds two readings, in the same spirit. Window claims are read with the bucket
//! claims (before the routes): a segment being written is protected by its window's claim
//! until its switch makes it a route. Retired objects (those a switch replaced with a
//! segment) are read after the routes: a switch records the old key as retired in the same
//! transaction that removes its route, so an object is always either routed or retired at
//! the moment it is looked at. A retired object is kept until it has been retired for the
//! retirement delay ([`super::ArchiverConfig::retirement_delay`]: the longest a reader may
//! still act on a route it read, or the backup retention, whichever is longer, plus skew),
//! since its age from creation says nothing about when readers, or a restored hot-store
//! backup, stopped naming it; its retired row is forgotten once its objects are gone.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use chrono::Utc;
use tracing::info;

use crate::archive::erasure::ErasureId;
use crate::archive::{ArchiveStore, ObjectInfo};
use crate::store::{BucketState, HotStore};

use super::{ArchiverError, ArchiverMetrics};

/// What one GC pass saw and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Objects listed under the prefix.
    pub listed: usize,
    /// Objects kept because a route or an in-flight claim references them.
    pub referenced: usize,
    /// Unreferenced objects kept because they are younger than the delay (or undated).
    pub young: usize,
    /// Objects deleted.
    pub deleted: usize,
    /// Delete and edit records forgotten: their rows were rewritten at least the retirement
    /// delay ago, so no reader can still hold a route to an object that needs them.
    pub masks_forgotten: u64,
    /// Noted prefixes forgotten (incremental passes): nothing under them waits any more.
    pub prefixes_forgotten: u64,
    /// Segments whose bucket count was recorded from their manifest (full passes; see
    /// [`super::segment_counts`]).
    pub segments_counted: u64,
}

/// Rewritten masks forgotten per statement of a GC pass.
const MASKS_PER_BATCH: usize = 10_000;

/// The generation directory of an object key (`.../g<generation>/`), the unit of reference.
fn generation_dir(key: &str) -> &str {
    key.rsplit_once('/').map_or(key, |(dir, _)| dir)
}

/// The window directory of a segment object key (`.../segments/<window>/`, with the
/// trailing slash), the unit a window claim protects; `None` for any other key. Every
/// listed object is looked up by it in a hash set, so a pass is linear in the objects
/// listed plus the claims and retired rows read.
fn window_dir(key: &str) -> Option<&str> {
    const MARK: &str = "/segments/";
    let at = key.rfind(MARK)? + MARK.len();
    let end = at + key[at..].find('/')? + 1;
    Some(&key[..end])
}

/// The two ages GC waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcDelays {
    /// An unreferenced object must be at least this old (from its creation).
    pub orphans: Duration,
    /// A retired object must have been retired at least this long (store clock): see
    /// [`super::ArchiverConfig::retirement_delay`].
    pub retired: Duration,
    /// A retired object that holds erased rows (the erasure log names it) is deleted once
    /// retired this long, not kept for the backup retention: see
    /// [`super::ArchiverConfig::erased_retirement_delay`]. An unreferenced one waits the
    /// longer of this and the orphan delay.
    pub erased: Duration,
}

/// One GC pass with the orphan delay `delay` and the default retirement delay
/// ([`super::ArchiverConfig::retirement_delay`] of the defaults). `delay` is taken as given
/// (a test may pass zero when no worker runs); the archiver passes its validated
/// configuration's [`super::Runner::gc_delays`] to [`collect_garbage_with`].
pub async fn collect_garbage(
    store: &dyn HotStore,
    archive: &ArchiveStore,
    delay: Duration,
    metrics: &ArchiverMetrics,
) -> Result<GcReport, ArchiverError> {
    let defaults = super::ArchiverConfig::with_defaults();
    let delays = GcDelays {
        orphans: delay,
        retired: defaults.retirement_delay(),
        erased: defaults.erased_retirement_delay(),
    };
    collect_garbage_with(store, archive, delays, metrics).await
}

/// One full GC pass: the whole archive prefix is listed (see the module comment for the
/// order of its readings), then the segments recorded without their bucket count get it
/// ([`super::segment_counts`]). What every archiver runs at its start and daily; in
/// between, [`collect_garbage_incremental`].
pub async fn collect_garbage_with(
    store: &dyn HotStore,
    archive: &ArchiveStore,
    delays: GcDelays,
    metrics: &ArchiverMetrics,
) -> Result<GcReport, ArchiverError> {
    let now = Utc::now();
    let objects = archive.list_objects().await?;
    let swept = sweep(
        store,
        archive,
        delays,
        metrics,
        now,
        objects,
        Scope::Everything,
    )
    .await?;
    let mut report = swept.report;
    // Registry upkeep that needs the archive and is rare enough for the daily pass: segments
    // recorded without their count are listed one by one until it is recorded.
    // Its failure is not the pass's: the deletions are done, and the segments stay listed
    // bucket by bucket until the next full pass.
    report.segments_counted = match super::segment_counts::record_segment_counts(store, archive)
        .await
    {
        Ok(counted) => counted.recorded,
        Err(e) => {
            tracing::warn!(error = %e, "recording segment counts failed; the next full pass tries again");
            0
        }
    };
    Ok(report)
}

/// Noted prefixes looked at per incremental pass (the oldest first; the rest wait for the
/// next pass).
const PREFIXES_PER_PASS: usize = 10_000;

/// One incremental GC pass: only the directories noted as ones where unrouted objects may
/// be left ([`crate::store::Lifecycle::note_gc_prefix`], at least one orphan delay ago) and
/// those of retired objects due for deletion are listed, so a pass costs what it may
/// delete, not a listing of the whole archive. The decisions and the order of the readings
/// are the full pass's (after the listing: claims, routes, retired objects); the routes are
/// asked about the listed objects only. A noted prefix is forgotten once nothing under it
/// was kept for its age or a claim, and only if it was not noted again since it was read.
/// Objects no noting names (written by a build without notings, or by a writer that kept
/// going past its deadline) are found by the full passes.
pub async fn collect_garbage_incremental(
    store: &dyn HotStore,
    archive: &ArchiveStore,
    delays: GcDelays,
    metrics: &ArchiverMetrics,
) -> Result<GcReport, ArchiverError> {
    let now = Utc::now();
    let noted = store
        .gc_prefixes(delays.orphans, &archive.root_prefix(), PREFIXES_PER_PASS)
        .await?;
    // A first reading of the retired objects only chooses which directories to list (the
    // shorter of the two retirement delays: a superset of the due ones); what is deleted is
    // decided on the reading after the routes, and only retired rows whose directory was
    // listed are forgotten.
    let store_now = store.now().await?;
    let soonest = delays.retired.min(delays.erased);
    // Only this archive's notings are read (another root's are left alone, as a full
    // listing of this prefix leaves them).
    let mut dirs: BTreeSet<String> = noted.iter().map(|g| g.prefix.clone()).collect();
    for r in store.retired_objects().await? {
        let retired_for = store_now
            .as_micros()
            .saturating_sub(r.retired_at.as_micros());
        if u128::try_from(retired_for).unwrap_or(0) >= soonest.as_micros()
            && archive.holds_key(&r.object_key)
        {
            dirs.insert(format!("{}/", generation_dir(&r.object_key)));
        }
    }
    let mut objects = Vec::new();
    for dir in &dirs {
        objects.extend(archive.list_under(dir).await?);
    }
    // A noted window directory holds generation directories listed on their own too.
    objects.sort_by(|a, b| a.key.cmp(&b.key));
    objects.dedup_by(|a, b| a.key == b.key);
    let swept = sweep(
        store,
        archive,
        delays,
        metrics,
        now,
        objects,
        Scope::Listed(&dirs),
    )
    .await?;
    let done: Vec<_> = noted
        .into_iter()
        .filter(|g| !swept.held.iter().any(|k| k.starts_with(&g.prefix)))
        .collect();
    let mut report = swept.report;
    report.prefixes_forgotten = store.forget_gc_prefixes(&done).await?;
    Ok(report)
}

/// What a sweep covers: every object (a full listing), or the objects under these
/// directories (each ending with `/`).
enum Scope<'a> {
    Everything,
    Listed(&'a BTreeSet<String>),
}

impl Scope<'_> {
    /// Whether the directory of `key` was listed whole.
    fn covers(&self, key: &str) -> bool {
        match self {
            Self::Everything => true,
            Self::Listed(dirs) => dirs.iter().any(|d| key.starts_with(d.as_str())),
        }
    }
}

/// A sweep's report, and the keys it kept for their age or a claim (what a later pass must
/// look at again).
struct Swept {
    report: GcReport,
    held: Vec<String>,
}

/// Decides and deletes among `objects` (listed before this call, at or after `now`): the
/// readings after the listing, in their order, then one decision per object.
async fn sweep(
    store: &dyn HotStore,
    archive: &ArchiveStore,
    delays: GcDelays,
    metrics: &ArchiverMetrics,
    now: chrono::DateTime<Utc>,
    objects: Vec<ObjectInfo>,
    scope: Scope<'_>,
) -> Result<Swept, ArchiverError> {
    // Claims strictly before routes (see the module comment): never the other way round.
    // The in-flight claims alone, from the state index: a read that grows with the claims,
    // not with the registry (a listing of every bucket of every table did, docs/sizing.md).
    let claimed: HashSet<String> = store
        .archiving_claims()
        .await?
        .iter()
        .filter(|meta| meta.state == BucketState::Archiving)
        .map(|meta| generation_dir(&archive.manifest_key(&meta.id, meta.generation)).to_string())
        .collect();
    // A window being compacted: everything under its segments directory is kept, while its
    // claim can still lead to a switch. A claim whose lease has expired can never switch
    // (the switch checks the lease on the store's clock, and an expired claim cannot be
    // renewed); it protects its window for one more orphan delay after the expiry (a switch
    // transaction that began before the expiry may still commit), then nothing: a process
    // that died between its switch and its release leaves a claim nobody releases, which
    // must not keep the window's older generations (and their retired rows) forever. The
    // store's clock is read before the claims, so a claim counted as expired was so when
    // it was read.
    let claims_now = store.now().await?;
    let grace = i64::try_from(delays.orphans.as_micros()).unwrap_or(i64::MAX);
    let claimed_windows: HashSet<String> = store
        .compaction_claims()
        .await?
        .iter()
        .filter(|c| c.lease_expires_at.as_micros().saturating_add(grace) > claims_now.as_micros())
        .map(|c| archive.segments_prefix(&c.table_id, &c.window_key))
        .collect();
    // Routes after the claims: all of them for a full listing (one read, cheaper than a
    // probe per object there), else only those among the listed objects and the manifest
    // of each listed directory (an index probe each).
    let routed: HashSet<String> = match scope {
        Scope::Everything => store.referenced_object_keys().await?,
        Scope::Listed(_) => {
            let mut asked: BTreeSet<String> = BTreeSet::new();
            for o in &objects {
                asked.insert(o.key.clone());
                asked.insert(format!("{}/manifest.json", generation_dir(&o.key)));
            }
            let asked: Vec<String> = asked.into_iter().collect();
            store.routed_among(&asked).await?
        }
    }
    .iter()
    .map(|k| generation_dir(k).to_string())
    .collect();
    // Objects that hold erased rows, by directory, with the erasure and manifest key that
    // name them: retired, they wait only for the readers (`delays.erased`).
    let erased: HashMap<String, (ErasureId, String)> = crate::erasure::pending_objects(archive)
        .await?
        .into_iter()
        .map(|(key, id)| (generation_dir(&key).to_string(), (id, key)))
        .collect();
    // Retired objects after routes (see the module comment).
    let store_now = store.now().await?;
    let mut retired_kept: HashSet<String> = HashSet::new();
    let mut expired: HashSet<String> = HashSet::new();
    let mut expired_keys: Vec<String> = Vec::new();
    for r in store.retired_objects().await? {
        let retired_for = store_now
            .as_micros()
            .saturating_sub(r.retired_at.as_micros());
        let delay = if erased.contains_key(generation_dir(&r.object_key)) {
            delays.erased
        } else {
            delays.retired
        };
        let due = u128::try_from(retired_for).unwrap_or(0) >= delay.as_micros();
        if due {
            expired.insert(generation_dir(&r.object_key).to_string());
            expired_keys.push(r.object_key);
        } else {
            retired_kept.insert(generation_dir(&r.object_key).to_string());
        }
    }
    let mut report = GcReport {
        listed: objects.len(),
        ..GcReport::default()
    };
    let mut held: Vec<String> = Vec::new();
    let mut left: HashSet<String> = HashSet::new();
    let log_root = archive.erasure_log_root();
    for obj in objects {
        // The erasure log is never garbage: it must outlive every restore.
        if obj.key.starts_with(&log_root) {
            report.referenced += 1;
            continue;
        }
        let dir = generation_dir(&obj.key);
        let by_claim = claimed.contains(dir)
            || window_dir(&obj.key).is_some_and(|w| claimed_windows.contains(w));
        if by_claim || routed.contains(dir) || retired_kept.contains(dir) {
            report.referenced += 1;
            left.insert(dir.to_string());
            if by_claim {
                held.push(obj.key);
            }
            continue;
        }
        let old_enough = obj.last_modified.is_some_and(|m| {
            now.signed_duration_since(m)
                .to_std()
                .is_ok_and(|age| age >= delays.orphans)
        });
        if !old_enough {
            report.young += 1;
            left.insert(dir.to_string());
            held.push(obj.key);
            continue;
        }
        archive.delete_object(&obj.key).await?;
        metrics.gc_deletions.inc();
        if expired.contains(dir) {
            metrics.retired_deletions.inc();
        }
        info!(key = %obj.key, "deleted unreferenced archive object");
        if let Some((id, manifest_key)) = erased.get(dir) {
            if *manifest_key == obj.key {
                archive
                    .log_erased_object_deleted(id, &obj.key, Utc::now())
                    .await?;
                info!(key = %obj.key, erasure = %id, "deleted an object that held erased rows");
            }
        }
        report.deleted += 1;
    }
    // Retired rows whose objects are all gone (deleted now or earlier) are done with; on an
    // incremental pass, only those whose directory was listed (one retired since the first
    // reading was not looked at).
    let gone: Vec<String> = expired_keys
        .into_iter()
        .filter(|k| scope.covers(k) && !left.contains(generation_dir(k)))
        .collect();
    if !gone.is_empty() {
        store.forget_retired(&gone).await?;
    }
    // Masks whose rows a rewrite applied are kept for the same delay as the objects that
    // rewrite retired: a reader holding the old route applies them until then.
    loop {
        let n = store
            .forget_purged_masks(delays.retired, MASKS_PER_BATCH)
            .await?;
        report.masks_forgotten += n;
        metrics.masks_forgotten.inc_by(n);
        if n < MASKS_PER_BATCH as u64 {
            break;
        }
    }
    Ok(Swept { report, held })
}

#[cfg(test)]
mod tests {
    use super::{generation_dir, window_dir};

    #[test]
    fn segment_objects_are_grouped_by_window_directory() {
        assert_eq!(
            window_dir("p/v4/t/segments/month:2024-03/0-2/manifest.json"),
            Some("p/v4/t/segments/month:2024-03/")
        );
        assert_eq!(
            window_dir("p/v4/t/01/day:2024-01-01/g3/manifest.json"),
            None
        );
        assert_eq!(window_dir("p/v4/t/segments/"), None);
    }

    #[test]
    fn objects_are_grouped_by_generation_directory() {
        assert_eq!(
            generation_dir("p/v4/t/01/day:2024-01-01/g3/manifest.json"),
            "p/v4/t/01/day:2024-01-01/g3"
        );
        assert_eq!(
            generation_dir("p/v4/t/01/day:2024-01-01/g3/payload.parquet"),
            generation_dir("p/v4/t/01/day:2024-01-01/g3/manifest.json")
        );
        assert_ne!(
            generation_dir("a/g3/manifest.json"),
            generation_dir("a/g31/manifest.json")
        );
    }
}
