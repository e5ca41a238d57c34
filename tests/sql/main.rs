//! SQL-surface integration tests against a real PostgreSQL (127.0.0.1:5432, database
//! `test`): each test works in its own schema. Archives live in memory or a temporary
//! directory.

mod common;
mod end_to_end;
mod correctness;
mod dataset;
mod plans;
mod errors;
mod routes;
mod repl;
