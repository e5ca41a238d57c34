//! "Is it gone": an erasure's state judged from what the tiers hold now.
//!
//! Nothing here trusts a record that says a step was done: rows are looked for through the
//! table's reads, hot copies through the registry, and stored objects are listed and read.
//! A report is complete only when every check passed; each check that did not says what is
//! still pending, so an operator can tell a rewrite that has not run yet from a cleanup
//! delay or a garbage collection delay.

use std::collections::HashSet;

use chrono::{DateTime, Utc};

use super::{by_bucket, erased_rows_in, readable_rows, ErasureEntry, ErasureError};
use crate::store::BucketState;
use crate::table::DurableTable;

/// One object the erasure concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectState {
    /// Stored, and holding erased rows (its bucket's rewrite, or its deletion, is pending).
    Holding {
        /// Erased rows it holds.
        rows: usize,
    },
    /// An upload without a manifest (a crashed write) in a directory that may hold the
    /// subject's buckets: its bytes cannot be looked into, so it is pending until garbage
    /// collection deletes it (after the GC delay).
    Unverified,
    /// Named by the log and no longer stored: nothing is left under its directory.
    Absent {
        /// When garbage collection recorded deleting it, if it did.
        deleted_at: Option<DateTime<Utc>>,
    },
}

/// An erasure's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErasureReport {
    /// The log's entry.
    pub entry: ErasureEntry,
    /// Erased rows a query can still read (must be 0).
    pub readable: usize,
    /// Archived buckets whose hot copy (the rows before cleanup) still holds erased rows.
    pub hot_copies: Vec<String>,
    /// Every object the log names and every stored object found holding erased rows, by
    /// manifest key, with its state.
    pub objects: Vec<(String, ObjectState)>,
}

impl ErasureReport {
    /// Whether the erasure is complete: nothing readable, no hot copy, every object the log
    /// names absent and no stored object holding an erased row.
    pub fn is_gone(&self) -> bool {
        self.readable == 0
            && self.hot_copies.is_empty()
            && self.entry.applied
            && self.entry.objects.is_some()
            && self
                .objects
                .iter()
                .all(|(_, s)| matches!(s, ObjectState::Absent { .. }))
    }

    /// What is still pending, one line each; empty when gone.
    pub fn pending(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.readable > 0 {
            out.push(format!(
                "{} erased rows are still readable (run `pulpitum-archiver --once`: its start re-applies the erasure log)",
                self.readable
            ));
        }
        if !self.entry.applied || self.entry.objects.is_none() {
            out.push(
                "the request did not complete (it printed no id): it is not re-applied; run the erasure again".into(),
            );
        }
        for b in &self.hot_copies {
            out.push(format!(
                "{b}: the hot copy of this archived bucket still holds erased rows (its cleanup is pending)"
            ));
        }
        for (key, state) in &self.objects {
            if matches!(state, ObjectState::Unverified) {
                out.push(format!(
                    "{key}: an upload without a manifest (a crashed write) that may hold erased rows; garbage collection deletes it after the GC delay"
                ));
            }
            if let ObjectState::Holding { rows } = state {
                out.push(format!(
                    "{key}: holds {rows} erased rows (compaction rewrites its buckets, then garbage collection deletes it)"
                ));
            }
        }
        out
    }
}

/// Judges the erasure `entry` against `table` (its table) and the archive.
pub async fn report(
    table: &DurableTable,
    entry: ErasureEntry,
) -> Result<ErasureReport, ErasureError> {
    let def = table.definition();
    let archive = table.archive();
    let mut readable = 0;
    let mut hot_copies = Vec::new();
    let mut holding: Vec<(String, ObjectState)> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    for (_, (bucket, keys)) in by_bucket(&def.table_id, def.strategy, &entry.keys) {
        // Readable: through the table's own reads (hot pages, archives with masks).
        readable += readable_rows(table, &bucket, &keys).await?.len();
        // A hot copy: an archived bucket whose hot rows cleanup has not removed yet. The
        // statement masked the archived rows; the copies go with the cleanup.
        if let Some(meta) = table.store().bucket(&bucket).await? {
            if let BucketState::Archived {
                hot_deleted: false, ..
            } = meta.state
            {
                hot_copies.push(bucket.to_string());
            }
        }
        // Uploads that never got a manifest, where the bucket's objects live: unreadable,
        // so pending until they are gone.
        for dir in archive.unmanifested_dirs_of_bucket(&bucket).await? {
            if seen.insert(dir.clone()) {
                holding.push((dir, ObjectState::Unverified));
            }
        }
        // Stored objects: every one that holds the bucket, read.
        for (key, route) in archive.objects_of_bucket(&bucket).await? {
            let rows = erased_rows_in(archive, &route, &bucket, &keys).await?;
            if rows > 0 {
                if let Some((_, ObjectState::Holding { rows: r })) =
                    holding.iter_mut().find(|(k, _)| *k == key)
                {
                    *r += rows;
                } else {
                    seen.insert(key.clone());
                    holding.push((key, ObjectState::Holding { rows }));
                }
            }
        }
    }
    let mut objects = holding;
    for key in entry.objects.iter().flatten() {
        if seen.contains(key) {
            continue;
        }
        if archive.object_dir_is_empty(key).await? {
            objects.push((
                key.clone(),
                ObjectState::Absent {
                    deleted_at: entry.deleted.get(key).copied(),
                },
            ));
        } else {
            // Still stored, though the read above found no erased row in it for these
            // buckets (another bucket's rows): the log named it, so it must go too.
            objects.push((key.clone(), ObjectState::Holding { rows: 0 }));
        }
    }
    objects.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(ErasureReport {
        entry,
        readable,
        hot_copies,
        objects,
    })
}
