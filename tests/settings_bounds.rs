//! The largest lease and retry delay the archiver accepts work on both stores (PostgreSQL
//! interval arithmetic, SQLite microsecond integers) without overflow, and anything larger is
//! refused before it reaches a store.

mod archiver_support;

use std::sync::Arc;
use std::time::Duration;

use archiver_support::*;
use pulpitum::archiver::config::{LEASE, RETRY};
use pulpitum::archiver::ArchiverConfig;
use pulpitum::model::{BucketStrategy, EventTime, PartitionKey, Record, SortKey, TableId};
use pulpitum::store::embedded::SqliteStore;
use pulpitum::store::{BucketFilter, BucketState, Eligibility, HotStore, TableDefinition};

async fn max_lease_and_retry_work(store: Arc<dyn HotStore>, label: &str) {
    store.migrate().await.unwrap();
    let table = TableId::new("chat").unwrap();
    store
        .register_table(&TableDefinition::new(
            table.clone(),
            BucketStrategy::CalendarDayUtc,
            "chat",
        ))
        .await
        .unwrap();
    store
        .append(
            &table,
            &Record {
                partition_key: PartitionKey::new(vec![1]).unwrap(),
                event_time: EventTime::parse_rfc3339("2021-02-03T04:05:06Z").unwrap(),
                sort_key: SortKey::new(vec![1]).unwrap(),
                value: b"hi".to_vec(),
            },
        )
        .await
        .unwrap();
    let bucket = store
        .list_buckets(&table, &BucketFilter::default())
        .await
        .unwrap()[0]
        .id
        .clone();
    let day = 24 * 3600 * 1_000_000i64;
    let now = store.now().await.unwrap().as_micros();
    let claim = store
        .claim(&bucket, LEASE.max)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{label}: claim refused"));
    let lease_us = i64::try_from(LEASE.max.as_micros()).unwrap();
    let ahead = claim.expires_at.as_micros() - now;
    assert!(
        (lease_us - 60_000_000..=lease_us + 60_000_000).contains(&ahead),
        "{label}: lease ends {ahead} us ahead, expected about {lease_us}"
    );
    let renewed = store.renew(&claim, LEASE.max).await.unwrap();
    assert!(renewed.expires_at.as_micros() >= claim.expires_at.as_micros());
    store.defer_archive(&renewed, RETRY.max).await.unwrap();
    let meta = store.bucket(&bucket).await.unwrap().unwrap();
    assert!(
        matches!(meta.state, BucketState::Hot),
        "{label}: {:?}",
        meta.state
    );
    // Deferred for seven days: not discoverable now.
    let cutoff = EventTime::parse_rfc3339("2022-01-01T00:00:00Z").unwrap();
    assert!(
        store
            .discover(&Eligibility::before(cutoff), 10)
            .await
            .unwrap()
            .is_empty(),
        "{label}"
    );
    assert!(LEASE.max.as_micros() as i64 <= day && RETRY.max.as_micros() as i64 <= 7 * day);
}

#[tokio::test]
async fn the_largest_accepted_lease_and_retry_work_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn HotStore> = Arc::new(SqliteStore::open(dir.path().join("h.db")).unwrap());
    max_lease_and_retry_work(store, "sqlite").await;
}

#[tokio::test]
async fn the_largest_accepted_lease_and_retry_work_on_postgres() {
    let db = fresh_database("bounds").await;
    let store = pulpitum::store::open(&db).await.unwrap();
    max_lease_and_retry_work(store, "postgres").await;
}

#[test]
fn larger_values_are_refused_before_reaching_a_store() {
    for (name, set) in [
        (
            "lease",
            (|c: &mut ArchiverConfig| c.lease = LEASE.max + Duration::from_secs(1))
                as fn(&mut ArchiverConfig),
        ),
        ("retry", |c| c.retry = RETRY.max + Duration::from_secs(1)),
        ("lease u64::MAX", |c| {
            c.lease = Duration::from_secs(u64::MAX)
        }),
        ("upload deadline 0", |c| c.upload_deadline = Duration::ZERO),
        ("gc delay 0", |c| c.gc_delay = Duration::ZERO),
        ("page rows 0", |c| c.snapshot_page_rows = 0),
    ] {
        let mut c = ArchiverConfig::with_defaults();
        set(&mut c);
        let err = c.validate().expect_err(name).to_string();
        assert!(err.contains("accepted"), "{name}: {err}");
    }
    assert!(LEASE.parse("1e30").is_err());
    assert!(LEASE.parse("86400").is_ok());
}
