//! The hot-store conformance suite: behaviour every [`HotStore`] must share, whatever its
//! backend. Each case takes a fresh, empty store (its own schema or file) and asserts the
//! contract of `src/store/roles.rs`: the fence (ARCHITECTURE.md invariant 2), claim checks
//! in the writing statement (3), one route per read (7) and idempotent steps (9).
//!
//! A test binary runs each case once per backend, e.g.
//! `conformance::fence_under_concurrency(store).await` inside a `#[tokio::test]`. Cases that
//! wait for leases to expire use leases of a few hundred milliseconds, and need a
//! multi-threaded runtime only for the concurrency cases.
//!
//! # Layout
//!
//! The cases follow the roles the store's contract is split into, one file per role:
//!
//! - `catalog.rs`: migrations and table registrations (`Catalog`).
//! - `appends.rs`: appends, idempotence, the fence, the writable-bucket guard, bad input
//!   and the SQL `INSERT` on top of the store (`Appends`).
//! - `reads.rs`: listings, `read_page`, `read_head` and scan bounds (`RoutedReads`).
//! - `lifecycle.rs`: claim, renew, snapshot, defer, publish, cleanup, discovery, backlog
//!   and the garbage-collection queries (`Lifecycle`).
//! - `control.rs`: policies, pauses, eligibility by policy and job history (`Control`).
//! - `compaction.rs`: window claims, candidates and window state, the route switch and
//!   retired objects (`Compaction`).
//!
//! This file holds the one case list, [`every_case!`], and the helpers the cases share.
//! The cases are re-exported here, so a runner names each one `conformance::<case>`
//! whichever file it lives in.

#![allow(dead_code)]

mod appends;
mod catalog;
mod compaction;
mod control;
mod lifecycle;
mod reads;

pub use appends::*;
pub use catalog::*;
pub use compaction::*;
pub use control::*;
pub use lifecycle::*;
pub use reads::*;

/// Invokes `$runner!` with every case of the suite. Each store's test file defines its runner
/// (how to build a fresh store) and calls this once, so a case added here runs on both stores.
/// Grouped by the file that holds the cases.
macro_rules! every_case {
    ($runner:ident) => {
        $runner!(
            // catalog.rs
            migrate_is_idempotent,
            register_table_is_immutable,
            // appends.rs
            append_to_unknown_table_is_refused,
            append_creates_hot_bucket,
            duplicate_appends,
            writable_bucket_guard,
            batch_is_all_or_nothing,
            fence_under_concurrency,
            bad_input_is_typed_and_writes_nothing,
            sql_insert_is_one_transaction,
            a_write_of_an_abandoned_statement_commits_nothing,
            // reads.rs
            read_page_matches_reference,
            read_page_missing_and_empty,
            list_buckets_filters,
            read_head_matches_listing_and_page,
            read_head_finds_the_first_bucket_of_a_long_history,
            // lifecycle.rs
            full_lifecycle,
            defer_archive_sets_retry_time,
            expired_lease_is_rejected,
            stale_token_and_generation_are_rejected,
            wrong_state_transitions_are_rejected,
            cleanup_lease_expires,
            renew_extends_the_lease,
            racing_claimers,
            discover_orders_and_limits,
            backlog_counts_eligible_and_archiving,
            gc_reads_claims_routes_and_noted_prefixes,
            // control.rs
            policies_update_only_what_they_name,
            pauses_stop_claims_but_not_cleanup,
            archive_after_and_the_ceiling_decide_eligibility,
            cleanup_waits_for_the_longer_delay,
            job_history_records_abandons_and_prunes,
            // compaction.rs
            compaction_claims_are_fenced_by_token_generation_and_lease,
            the_work_list_finds_due_windows_and_pages_their_partitions,
            switch_moves_every_route_and_retires_the_sources,
            refused_switches_write_nothing,
            empty_buckets_are_dropped_under_the_claim,
            masks_are_work_until_a_rewrite_marks_them,
            a_bucket_created_again_does_not_inherit_its_namesakes_masks,
            the_masks_of_several_buckets_are_each_buckets_own,
            the_buckets_with_deletes_are_exactly_those_with_delete_records,
            a_listing_across_partitions_names_a_segment_only_while_it_holds_every_route,
            segment_counts_not_known_are_listed_in_pages_and_recorded_once,
            routes_to_a_retired_segment_are_work_and_its_last_bucket_retires_it,
            a_busy_partition_offers_its_ready_buckets_only_for_work_due_at_once,
        );
    };
}

use std::sync::Arc;
use std::time::Duration;

use pulpitum::model::batch_to_records;
use pulpitum::model::{
    BucketId, BucketStrategy, EventTime, PartitionKey, Record, ScanBounds, SortKey, TableId,
};
use pulpitum::store::{Claim, HotPage, HotStore, PageRequest, StoreError, TableDefinition};

/// A store under test.
pub type Store = Arc<dyn HotStore>;

const LONG: Duration = Duration::from_secs(60);
const SHORT: Duration = Duration::from_millis(300);
const PAST_SHORT: Duration = Duration::from_millis(450);

// ---------------------------------------------------------------------------------------
// helpers

fn tid(s: &str) -> TableId {
    TableId::new(s).unwrap()
}

fn pk(s: &str) -> PartitionKey {
    PartitionKey::new(s.as_bytes().to_vec()).unwrap()
}

fn t(s: &str) -> EventTime {
    EventTime::parse_rfc3339(s).unwrap()
}

fn rec(p: &str, time: EventTime, sort: &[u8], value: &[u8]) -> Record {
    Record {
        partition_key: pk(p),
        event_time: time,
        sort_key: SortKey::new(sort.to_vec()).unwrap(),
        value: value.to_vec(),
    }
}

async fn table(store: &Store, name: &str, strategy: BucketStrategy) -> TableId {
    store.migrate().await.unwrap();
    let def = TableDefinition::new(tid(name), strategy, "raw");
    store.register_table(&def).await.unwrap();
    def.table_id
}

fn bucket_of(table: &TableId, strategy: BucketStrategy, r: &Record) -> BucketId {
    BucketId::of_record(table, strategy, r)
}

async fn all_rows(store: &Store, b: &BucketId) -> Vec<Record> {
    match store
        .read_page(
            b,
            &PageRequest {
                bounds: ScanBounds::all(),
                descending: false,
                limit: 1_000_000,
                include_value: true,
            },
        )
        .await
        .unwrap()
    {
        HotPage::Hot { rows, .. } => batch_to_records(&rows).unwrap(),
        HotPage::Missing => Vec::new(),
        other => panic!("expected hot rows, got {other:?}"),
    }
}

async fn snapshot_all(store: &Store, claim: &Claim, page: usize) -> Vec<Record> {
    let mut out: Vec<Record> = Vec::new();
    loop {
        let after = out.last().map(|r| r.clustering_key());
        let rows = store
            .snapshot_page(claim, after.as_ref(), page)
            .await
            .unwrap();
        let n = rows.len();
        out.extend(rows);
        if n < page {
            return out;
        }
    }
}

fn assert_stale<T: std::fmt::Debug>(r: Result<T, StoreError>, what: &str) {
    match r {
        Err(StoreError::StaleClaim { .. }) => {}
        other => panic!("{what}: expected StaleClaim, got {other:?}"),
    }
}

fn assert_invalid<T: std::fmt::Debug>(r: Result<T, StoreError>, what: &str) {
    match r {
        Err(StoreError::InvalidTransition { .. }) => {}
        other => panic!("{what}: expected InvalidTransition, got {other:?}"),
    }
}

fn state_of(meta: &Option<pulpitum::store::BucketMeta>) -> &'static str {
    meta.as_ref().expect("bucket metadata").state.name()
}
