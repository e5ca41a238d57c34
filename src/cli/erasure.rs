//! `pulpitum erasure request | show | list`: erasures from the command line, with the
//! answers an operator files with a request (see `docs/operations.md`, "An erasure request").
//!
//! Each command opens the store and the archive itself and prints plain lines: the id and
//! counts after a request; after `show`, every check of the proof ([`crate::erasure::report`])
//! with its state, then `gone` or `pending`, which is also the exit status (0 when gone), so
//! a script can wait for it.

use std::fmt::Write as _;
use std::sync::Arc;

use datafusion::prelude::SessionContext;

use crate::archive::erasure::ErasureId;
use crate::archive::ArchiveStore;
use crate::erasure::{ErasureError, ObjectState};
use crate::store::HotStore;
use crate::table::DurableTable;

/// Runs `sql` (one `DELETE`) as an erasure on `ctx`; the lines to print.
pub async fn request(
    ctx: &SessionContext,
    sql: &str,
    reference: Option<&str>,
) -> Result<String, ErasureError> {
    let r = crate::erasure::request(ctx, sql, reference).await?;
    let objects = if r.objects == 0 {
        "no stored object holds them".to_string()
    } else {
        format!(
            "{} stored objects still hold them (compaction rewrites them, garbage collection then deletes them)",
            r.objects
        )
    };
    Ok(format!(
        "erasure {}: {} rows of {} deleted; {objects}\ncheck it with: pulpitum erasure show {}",
        r.id, r.rows, r.table_id, r.id
    ))
}

/// The proof of erasure `id`, or of every erasure in the log when `None`: the lines to
/// print, and whether it is (they all are) gone.
pub async fn show(
    store: Arc<dyn HotStore>,
    archive: Arc<ArchiveStore>,
    id: Option<&str>,
) -> Result<(String, bool), ErasureError> {
    let ids = match id {
        Some(id) => vec![ErasureId::parse(id).map_err(|_| ErasureError::BadId(id.into()))?],
        None => archive.erasure_ids().await?,
    };
    if ids.is_empty() {
        return Ok(("no erasures in the log".into(), true));
    }
    let mut out = Vec::new();
    let mut all_gone = true;
    for id in ids {
        let (text, gone) = show_one(store.clone(), archive.clone(), id).await?;
        out.push(text);
        all_gone &= gone;
    }
    Ok((out.join("\n\n"), all_gone))
}

async fn show_one(
    store: Arc<dyn HotStore>,
    archive: Arc<ArchiveStore>,
    id: ErasureId,
) -> Result<(String, bool), ErasureError> {
    let entry = archive.read_erasure(&id).await?;
    let Some(def) = store.table(&entry.table_id).await? else {
        return Err(ErasureError::UnknownTable {
            id,
            table: entry.table_id,
        });
    };
    let table = DurableTable::new(store, archive, def);
    let report = crate::erasure::report(&table, entry).await?;
    let e = &report.entry;
    let mut out = String::new();
    let _ = writeln!(out, "erasure {}", e.id);
    let _ = writeln!(out, "  table          {}", e.table_id);
    if let Some(r) = &e.reference {
        let _ = writeln!(out, "  reference      {r}");
    }
    let _ = writeln!(out, "  requested at   {}", e.requested_at.to_rfc3339());
    let _ = writeln!(out, "  rows erased    {}", e.keys.len());
    let _ = writeln!(out, "  still readable {}", report.readable);
    let _ = writeln!(
        out,
        "  hot copies     {}",
        if report.hot_copies.is_empty() {
            "none left".to_string()
        } else {
            format!(
                "{} archived buckets not cleaned yet",
                report.hot_copies.len()
            )
        }
    );
    let _ = writeln!(out, "  objects");
    if report.objects.is_empty() {
        let _ = writeln!(out, "    (none held the rows)");
    }
    for (key, state) in &report.objects {
        let text = match state {
            ObjectState::Holding { rows } => format!("stored, holds {rows} erased rows"),
            ObjectState::Absent {
                deleted_at: Some(t),
            } => format!("absent (checked now); deleted at {}", t.to_rfc3339()),
            ObjectState::Absent { deleted_at: None } => "absent (checked now)".to_string(),
            ObjectState::Unverified => "stored upload without a manifest".to_string(),
        };
        let _ = writeln!(out, "    {key}: {text}");
    }
    let gone = report.is_gone();
    if gone {
        let _ = write!(out, "gone");
    } else {
        let _ = writeln!(out, "pending:");
        let pending = report.pending();
        for (i, p) in pending.iter().enumerate() {
            let _ = write!(out, "  {p}");
            if i + 1 < pending.len() {
                out.push('\n');
            }
        }
    }
    Ok((out, gone))
}

/// Every erasure in the log, one line each (id, time, table, rows, reference).
pub async fn list(archive: &ArchiveStore) -> Result<String, ErasureError> {
    let mut out = String::new();
    let ids = archive.erasure_ids().await?;
    if ids.is_empty() {
        return Ok("no erasures in the log".into());
    }
    for id in ids {
        let e = archive.read_erasure(&id).await?;
        let _ = writeln!(
            out,
            "{}  {}  {}  {} rows  {}{}",
            e.id,
            e.requested_at.to_rfc3339(),
            e.table_id,
            e.keys.len(),
            e.reference.as_deref().unwrap_or("-"),
            if e.applied {
                ""
            } else {
                "  (incomplete: the request failed)"
            }
        );
    }
    Ok(out.trim_end().to_string())
}
