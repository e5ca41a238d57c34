//! The processes reading a store, and the newest versions each reads: what lets a build
//! store a newer record schema or table schema format only once every running process can
//! read it.
//!
//! A process that reads the store (the shell, `pulpitum serve`, the archiver; an embedding
//! application may do the same) holds a [`ReaderLease`]: it records itself in
//! `pulpitum_v4_readers` with the newest record schema and table schema format this build
//! reads, refreshes that every [`HEARTBEAT`], and removes it when it stops. Starting, it
//! refuses a store where a table already needs more than it reads, naming the upgrade; each
//! refresh checks again, so a process that started in the instant a newer table was created
//! finds out within a heartbeat and says so.
//!
//! A statement that would store a version (creating a declared table: record schema 3;
//! changing its columns: the table schema format) first asks [`require_readers`]; a reader
//! seen within [`READER_TTL`] that reads less refuses it, by name. A process that died
//! without removing itself holds such a statement back for at most the TTL; its row is
//! deleted by a later start after [`READER_FORGET`].

use std::sync::Arc;
use std::time::Duration;

use crate::model::schema::{DECLARED_RECORD_SCHEMA_VERSION, SCHEMA_FORMAT};
use crate::model::EventTime;
use crate::store::{HotStore, ReaderInfo, StoreError};

/// How often a running process refreshes its record.
pub const HEARTBEAT: Duration = Duration::from_secs(60);
/// How long a record counts after its last refresh: a few missed heartbeats.
pub const READER_TTL: Duration = Duration::from_secs(300);

/// The newest versions this build reads.
pub fn this_build(role: &str) -> ReaderInfo {
    ReaderInfo {
        reader_id: format!(
            "{role}:{}:{}:{:08x}",
            hostname(),
            std::process::id(),
            rand::random::<u32>()
        ),
        role: role.to_string(),
        build: env!("CARGO_PKG_VERSION").to_string(),
        record_schema: DECLARED_RECORD_SCHEMA_VERSION,
        schema_format: SCHEMA_FORMAT,
        seen_at: EventTime::min_supported(),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// What a reader's check refused.
#[derive(Debug, thiserror::Error)]
pub enum ReaderError {
    /// A table needs a newer version than this process reads.
    #[error(
        "table {table} is stored with {what} {needs}, and this build ({build}) reads up to \
         {reads}: upgrade Pulpitum to a build that reads it before running this process"
    )]
    TooOld {
        /// The table.
        table: String,
        /// `record schema` or `table schema format`.
        what: &'static str,
        /// The table's version.
        needs: u32,
        /// What this build reads.
        reads: u32,
        /// This build.
        build: String,
    },
    /// Live processes read less than a statement would store.
    #[error(
        "{what} needs {needs}, which these running processes cannot read: {readers}; upgrade \
         them first (a process that stopped without saying so counts for {ttl} s after it was \
         last seen)"
    )]
    Readers {
        /// The statement.
        what: String,
        /// What it would store.
        needs: String,
        /// The processes, each with its build and what it reads.
        readers: String,
        /// [`READER_TTL`] in seconds.
        ttl: u64,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Refuses a store holding a table this reader cannot read: a record schema, or a declared
/// table's newest schema in a format, newer than it reads.
async fn check_tables(store: &dyn HotStore, me: &ReaderInfo) -> Result<(), ReaderError> {
    let too_old = |table: &str, what, needs| ReaderError::TooOld {
        table: table.to_string(),
        what,
        needs,
        reads: if what == "record schema" {
            me.record_schema
        } else {
            me.schema_format
        },
        build: me.build.clone(),
    };
    for t in store.tables().await? {
        let needs = u32::try_from(t.record_schema_version).unwrap_or(u32::MAX);
        if needs > me.record_schema {
            return Err(too_old(t.table_id.as_str(), "record schema", needs));
        }
        if t.surface != crate::provider::surface::declared::NAME {
            continue;
        }
        let Some(stored) = store.table_schema(&t.table_id).await? else {
            continue;
        };
        // Only the format field: a newer format need not parse as this build's schema. A
        // definition that is not JSON with a format is damage, not a newer version: the
        // session leaves that table out and says why, as for any unreadable schema.
        let Some(format) = serde_json::from_str::<serde_json::Value>(&stored.definition)
            .ok()
            .and_then(|v| v.get("format")?.as_u64())
        else {
            continue;
        };
        let format = u32::try_from(format).unwrap_or(u32::MAX);
        if format > me.schema_format {
            return Err(too_old(t.table_id.as_str(), "table schema format", format));
        }
    }
    Ok(())
}

/// How long a row may go unrefreshed before any process starting deletes it: its process
/// is long gone (or the row was never written by one, when it is that far in the future).
pub const READER_FORGET: Duration = Duration::from_secs(24 * 3600);

/// A process's record in the registry, refreshed while it is held.
pub struct ReaderLease {
    store: Arc<dyn HotStore>,
    id: String,
    task: tokio::task::JoinHandle<()>,
}

fn shifted(t: EventTime, by: Duration, forward: bool) -> EventTime {
    let d = i64::try_from(by.as_micros()).unwrap_or(i64::MAX);
    let us = if forward {
        t.as_micros().saturating_add(d)
    } else {
        t.as_micros().saturating_sub(d)
    };
    EventTime::from_micros(us).unwrap_or(if forward {
        EventTime::end_of_supported()
    } else {
        EventTime::min_supported()
    })
}

impl ReaderLease {
    /// Records this build as a reader with `role`, after checking that it reads every table
    /// in the store, and starts refreshing the record.
    pub async fn start(store: Arc<dyn HotStore>, role: &str) -> Result<Self, ReaderError> {
        Self::start_as(store, this_build(role)).await
    }

    /// [`Self::start`] with the versions given (tests stand in for older builds with it).
    ///
    /// A store that refuses the record (a role without the grant on `pulpitum_v4_readers`,
    /// a read-only file) does not stop the process: it runs unrecorded, with a warning,
    /// since what it reads is still checked here and at every refresh.
    pub async fn start_as(store: Arc<dyn HotStore>, me: ReaderInfo) -> Result<Self, ReaderError> {
        // Recorded before the check, so a statement that checks the readers after this sees
        // it; one that checked before and stores after this check is found by the next
        // refresh, which checks again.
        let recorded = match store.announce_reader(&me).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "this process is not recorded as a reader of the store, so a newer table \
                     version is not held back for it (docs/permissions.md grants the table)"
                );
                false
            }
        };
        if let Err(e) = check_tables(&*store, &me).await {
            if recorded {
                let _ = store.withdraw_reader(&me.reader_id).await;
            }
            return Err(e);
        }
        if recorded {
            if let Ok(now) = store.now().await {
                let (before, after) = (
                    shifted(now, READER_FORGET, false),
                    shifted(now, READER_FORGET, true),
                );
                if let Err(e) = store.forget_readers(before, after).await {
                    tracing::debug!(error = %e, "old reader rows not deleted");
                }
            }
        }
        let id = me.reader_id.clone();
        let bg = store.clone();
        let task = tokio::spawn(async move {
            let (mut warned, mut refresh_failed) = (false, !recorded);
            loop {
                tokio::time::sleep(HEARTBEAT).await;
                match bg.announce_reader(&me).await {
                    Ok(()) => refresh_failed = false,
                    Err(e) if !refresh_failed => {
                        tracing::warn!(error = %e, "could not refresh this process's reader record");
                        refresh_failed = true;
                    }
                    Err(_) => {}
                }
                match check_tables(&*bg, &me).await {
                    Err(e @ ReaderError::TooOld { .. }) if !warned => {
                        tracing::error!(error = %e, "a table this build cannot read appeared");
                        warned = true;
                    }
                    _ => {}
                }
            }
        });
        Ok(Self { store, id, task })
    }

    /// This record's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Stops refreshing and removes the record (a process stopping cleanly: it then holds
    /// nothing back for [`READER_TTL`]). Safe to call more than once.
    pub async fn stop(&self) {
        self.task.abort();
        if let Err(e) = self.store.withdraw_reader(&self.id).await {
            tracing::warn!(error = %e, "could not remove this process's reader record");
        }
    }
}

impl Drop for ReaderLease {
    fn drop(&mut self) {
        // Without `stop`, the record ages out after READER_TTL (and is deleted by a later
        // start after READER_FORGET).
        self.task.abort();
    }
}

/// Removes the reader record a session holds ([`crate::session::SessionOptions::reader`]),
/// if any: what a process does as it stops.
pub async fn release(ctx: &datafusion::prelude::SessionContext) {
    let lease = ctx.state().config().get_extension::<ReaderLease>();
    if let Some(lease) = lease {
        lease.stop().await;
    }
}

/// Refuses `what` (a statement that would store record schema `record_schema` or table
/// schema format `schema_format`) while a process seen within [`READER_TTL`] reads less.
pub async fn require_readers(
    store: &dyn HotStore,
    what: &str,
    record_schema: u32,
    schema_format: u32,
) -> Result<(), ReaderError> {
    let now = store.now().await?;
    let since = shifted(now, READER_TTL, false);
    // A row dated after now (beyond clock skew) was not written by a running process.
    let until = shifted(now, READER_TTL, true);
    let behind: Vec<String> = store
        .readers_since(since)
        .await?
        .into_iter()
        .filter(|r| r.seen_at <= until)
        .filter(|r| r.record_schema < record_schema || r.schema_format < schema_format)
        .map(|r| {
            format!(
                "{} ({}, build {}, reads record schema {} and table schema format {}, last seen \
                 {})",
                r.reader_id, r.role, r.build, r.record_schema, r.schema_format, r.seen_at
            )
        })
        .collect();
    if behind.is_empty() {
        return Ok(());
    }
    Err(ReaderError::Readers {
        what: what.to_string(),
        needs: if record_schema > 0 {
            format!("record schema {record_schema} and table schema format {schema_format}")
        } else {
            format!("table schema format {schema_format}")
        },
        readers: behind.join("; "),
        ttl: READER_TTL.as_secs(),
    })
}
