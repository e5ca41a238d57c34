//! Pulpitum: one logical, append-only, time-ordered table whose recent buckets live in
//! CockroachDB (or PostgreSQL, or an embedded SQLite file) and whose history lives as
//! immutable, verified objects in S3-compatible storage, served through SQL.
//!
//! Layers, lowest first (an upper layer may use a lower one, never the reverse):
//! [`model`] (pure values), [`store`] (hot tier) and [`archive`] (cold tier), [`archiver`]
//! (the fenced cutover runner), [`table`] (routed reads and fenced appends), [`provider`]
//! (DataFusion), [`control`] (policies, pauses and the system tables, beside the provider),
//! and [`session`] (the embedded entry point).

pub mod archive;
pub mod archiver;
pub mod cli;
pub mod control;
pub mod defaults;
pub mod demo;
pub mod distributed;
pub mod erasure;
pub mod exposition;
pub mod failpoint;
pub mod locator;
pub mod logging;
mod lru;
pub mod model;
mod pem;
pub mod prepared;
pub mod provider;
pub mod server;
pub mod session;
pub mod store;
pub mod table;
