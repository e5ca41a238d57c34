//! SQL-surface integration tests against a real PostgreSQL (127.0.0.1:5432, database
//! `test`): each test works in its own schema. Archives live in memory or a temporary
//! directory.

mod common;
mod correctness;
mod cutover;
mod dataset;
mod definitions;
mod end_to_end;
mod errors;
mod literals;
mod plans;
mod prepared;
mod repl;
mod routes;
mod system;
