//! Shared helpers: an isolated PostgreSQL schema per test, a session over it, and query
//! helpers that render results as text for comparison.

use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::prelude::SessionContext;
use pulpitum::archive::ArchiveStore;
use pulpitum::session::{session, SessionOptions};
use pulpitum::store::postgres::PgStore;
use pulpitum::store::{Catalog, HotStore};

pub const PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

pub struct Env {
    pub store: Arc<PgStore>,
    pub archive: Arc<ArchiveStore>,
    pub ctx: SessionContext,
    pub opts: SessionOptions,
}

impl Env {
    pub async fn new(name: &str) -> Self {
        Self::with_options(name, SessionOptions::default()).await
    }

    pub async fn with_options(name: &str, opts: SessionOptions) -> Self {
        let schema = format!("sqlt_{name}_{}", rand::random::<u32>());
        let store = Arc::new(
            PgStore::connect_with_schema(PG_URL, &schema)
                .await
                .expect("connect"),
        );
        // The schema owner's step; the sessions below only check the version.
        store.migrate().await.expect("migrate");
        let archive = Arc::new(ArchiveStore::from_url("memory://").expect("archive"));
        let ctx = session(store.clone() as Arc<dyn HotStore>, archive.clone(), opts)
            .await
            .expect("session");
        Self {
            store,
            archive,
            ctx,
            opts,
        }
    }

    /// A fresh session over the same store and archive (tables must be found again).
    pub async fn reopen(&self) -> SessionContext {
        session(
            self.store.clone() as Arc<dyn HotStore>,
            self.archive.clone(),
            self.opts,
        )
        .await
        .expect("session")
    }

    pub async fn sql(&self, sql: &str) -> Vec<RecordBatch> {
        run(&self.ctx, sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    pub async fn sql_err(&self, sql: &str) -> String {
        match run(&self.ctx, sql).await {
            Ok(b) => panic!("{sql} should fail, returned {}", pretty(&b)),
            Err(e) => e,
        }
    }

    pub async fn cleanup(self) {
        self.store.drop_schema().await.expect("drop schema");
    }
}

pub async fn run(ctx: &SessionContext, sql: &str) -> Result<Vec<RecordBatch>, String> {
    let df = ctx.sql(sql).await.map_err(|e| e.to_string())?;
    df.collect().await.map_err(|e| e.to_string())
}

pub fn pretty(b: &[RecordBatch]) -> String {
    pretty_format_batches(b)
        .map(|d| d.to_string())
        .unwrap_or_default()
}

pub fn rows(b: &[RecordBatch]) -> usize {
    b.iter().map(RecordBatch::num_rows).sum()
}
