//! The start-up probe for create-if-absent. Every archive object is created once and never
//! replaced (invariant 5), which rests entirely on the store refusing a conditional create of
//! an existing key. A store that accepts the flag and overwrites anyway (an S3 clone that
//! ignores `If-None-Match`, a proxy that strips it, a filesystem with check-then-rename
//! semantics) would let a late writer replace a published archive, so the archiver proves the
//! refusal on the real store before it works: create a fresh probe key, create it again, and
//! require the second create to be refused and the first content to survive.
//!
//! What OpenDAL 0.58 does underneath: S3 sends `If-None-Match: *` on the PUT (radosgw and AWS
//! refuse with 412); the in-memory service checks and inserts under one lock; the filesystem
//! service, built without an atomic write directory as `file://` URLs are, opens the target
//! with `O_CREAT|O_EXCL`. All three pass the probe.

use super::write::is_condition_failure;
use super::{ArchiveError, ArchiveStore};

const FIRST: &[u8] = b"pulpitum create-once probe: first write\n";
const SECOND: &[u8] = b"pulpitum create-once probe: second write, must be refused\n";

impl ArchiveStore {
    /// A description of this store for messages: scheme, bucket or root, and key prefix.
    /// It never contains credentials (the operator keeps them out of its info).
    pub fn describe(&self) -> String {
        let info = self.op.info();
        let mut out = format!("{}://{}", info.scheme(), info.name().trim_matches('/'));
        let root = info.root();
        let root = root.trim_matches('/');
        for part in [root, self.prefix.as_str()] {
            if !part.is_empty() {
                out.push('/');
                out.push_str(part);
            }
        }
        out
    }

    /// Proves that the store refuses to create an object that already exists: writes a
    /// unique probe key under the prefix twice with create-if-absent, requires the second
    /// write to be refused and the first content to remain, then deletes the probe.
    /// [`ArchiveError::CreateOnceUnsupported`] (naming the store) when the store accepts the
    /// second create, overwrites, or cannot do conditional creates at all; other errors when
    /// the store cannot be reached. The archiver calls this before any work.
    pub async fn check_create_once(&self) -> Result<(), ArchiveError> {
        let name = format!(
            "_probe/create-once-{}-{}-{:016x}",
            std::process::id(),
            chrono::Utc::now().timestamp_micros(),
            rand::random::<u64>()
        );
        let key = if self.prefix.is_empty() {
            name
        } else {
            format!("{}/{name}", self.prefix)
        };
        let result = self.probe(&key).await;
        // Cleaned up whatever the outcome. A probe left behind (the delete failing) is an
        // object no route names, so orphan GC removes it later.
        if let Err(e) = self.op.delete(&key).await {
            tracing::warn!(key, error = %e, "could not delete the create-once probe");
        }
        result
    }

    async fn probe(&self, key: &str) -> Result<(), ArchiveError> {
        let refuse = |reason: String| ArchiveError::CreateOnceUnsupported {
            store: self.describe(),
            reason,
        };
        let unsupported = |e: &opendal::Error| e.kind() == opendal::ErrorKind::Unsupported;
        match self.op.write_with(key, FIRST).if_not_exists(true).await {
            Ok(_) => {}
            // The key is unique to this probe: an object already there is this very write,
            // committed by an attempt whose response was lost and then retried.
            Err(e) if is_condition_failure(&e) => {}
            Err(e) if unsupported(&e) => {
                return Err(refuse(format!("conditional create is not supported ({e})")))
            }
            Err(e) => return Err(ArchiveError::storage("write", key, e)),
        }
        match self.op.write_with(key, SECOND).if_not_exists(true).await {
            Ok(_) => {
                return Err(refuse(format!(
                    "a second conditional create of the probe key {key} succeeded"
                )))
            }
            Err(e) if is_condition_failure(&e) => {}
            Err(e) if unsupported(&e) => {
                return Err(refuse(format!("conditional create is not supported ({e})")))
            }
            Err(e) => return Err(ArchiveError::storage("write", key, e)),
        }
        let back = self
            .op
            .read(key)
            .await
            .map_err(|e| ArchiveError::storage("read", key, e))?
            .to_vec();
        if back != FIRST {
            return Err(refuse(format!(
                "the refused second create of the probe key {key} replaced its content"
            )));
        }
        Ok(())
    }
}
