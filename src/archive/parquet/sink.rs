//! Where an encoded Parquet payload goes: [`PayloadSink`] hashes and counts the bytes on
//! their way to an OpenDAL writer (the parquet crate's [`AsyncFileWriter`]), and aborts an
//! upload that does not complete, so a failed or cancelled write leaves neither a multipart
//! upload to be billed nor a partial object at the payload's key.

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use parquet::arrow::async_writer::AsyncFileWriter;
use parquet::errors::ParquetError;

use crate::archive::integrity::{Digests, PayloadDigest};

/// Where payload bytes go while they are encoded: an OpenDAL writer (or nowhere, when only
/// the digest of an existing payload's twin is wanted), hashed and counted on the way.
///
/// An upload that is not closed successfully is aborted: on an error in `close`, on
/// [`Self::abort`], and when the sink is dropped with the upload still open (the write was
/// cancelled), so no multipart upload is left behind to be billed and no partial object
/// stays at the key.
pub(crate) struct PayloadSink {
    writer: Option<opendal::Writer>,
    /// The operator and key of the upload, for removing a partial file on abort.
    target: (opendal::Operator, String),
    digest: PayloadDigest,
}

/// Aborts an unfinished upload. Multipart uploads (S3) are aborted by the writer. The
/// filesystem cannot abort a file written in place; the writer created that file with
/// `O_EXCL`, so it is this writer's own and is removed. Nothing else is ever deleted here: on
/// other backends an existing object at the key may be another writer's.
async fn abort_upload(mut w: opendal::Writer, op: &opendal::Operator, key: &str) {
    match w.abort().await {
        Ok(()) => {}
        Err(e) if e.kind() == opendal::ErrorKind::Unsupported && op.info().scheme() == "fs" => {
            if let Err(e) = op.delete(key).await {
                tracing::warn!(key, error = %e, "could not remove a partial payload");
            }
        }
        Err(e) => tracing::warn!(key, error = %e, "could not abort a payload upload"),
    }
}

impl Drop for PayloadSink {
    fn drop(&mut self) {
        let Some(w) = self.writer.take() else {
            return;
        };
        let (op, key) = self.target.clone();
        // The abort is asynchronous; a dropped write has no future left to run it in.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move { abort_upload(w, &op, &key).await });
            }
            Err(_) => tracing::warn!(key, "payload upload dropped outside a runtime"),
        }
    }
}

impl PayloadSink {
    pub fn new(
        writer: Option<opendal::Writer>,
        op: &opendal::Operator,
        key: &str,
        block_size: u64,
    ) -> Self {
        Self {
            writer,
            target: (op.clone(), key.to_string()),
            digest: PayloadDigest::new(block_size),
        }
    }

    pub async fn put(&mut self, bs: Bytes) -> Result<(), opendal::Error> {
        self.digest.update(&bs);
        if let Some(w) = &mut self.writer {
            w.write(bs).await?;
        }
        Ok(())
    }

    /// Closes the upload (the conditional create happens here on most backends); a failed
    /// close aborts it.
    pub async fn close(&mut self) -> Result<(), opendal::Error> {
        if let Some(mut w) = self.writer.take() {
            if let Err(e) = w.close().await {
                let (op, key) = &self.target;
                abort_upload(w, op, key).await;
                return Err(e);
            }
        }
        Ok(())
    }

    /// Aborts the upload (best effort: failures are logged; a crash's leftovers are cleared
    /// by the bucket lifecycle rule in `docs/archiver.md`).
    pub async fn abort(&mut self) {
        if let Some(w) = self.writer.take() {
            let (op, key) = &self.target;
            abort_upload(w, op, key).await;
        }
    }

    pub fn finish_digest(mut self) -> Digests {
        std::mem::replace(&mut self.digest, PayloadDigest::new(4096)).finish()
    }
}

impl AsyncFileWriter for PayloadSink {
    fn write(&mut self, bs: Bytes) -> BoxFuture<'_, parquet::errors::Result<()>> {
        async move {
            self.put(bs)
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))
        }
        .boxed()
    }

    fn complete(&mut self) -> BoxFuture<'_, parquet::errors::Result<()>> {
        // The upload is closed by the caller, which needs to tell a failed conditional create
        // apart from an encoding error.
        async { Ok(()) }.boxed()
    }
}
