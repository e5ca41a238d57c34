//! Conformance cases for the store's catalog role (`Catalog` in `src/store/roles.rs`):
//! migrations that are safe to repeat, and table registrations that are immutable once
//! made. Every other case starts by migrating and registering, so these pin down the
//! ground the rest of the suite stands on.

use pulpitum::model::BucketStrategy;
use pulpitum::store::{StoreError, TableDefinition};

use super::{tid, Store};

/// Migrating twice is harmless.
pub async fn migrate_is_idempotent(store: Store) {
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    assert!(store.tables().await.unwrap().is_empty());
}

/// The identical definition twice is a no-op; another strategy is a conflict that changes
/// nothing.
pub async fn register_table_is_immutable(store: Store) {
    store.migrate().await.unwrap();
    let def = TableDefinition::new(tid("events"), BucketStrategy::CalendarMonthUtc, "raw");
    assert_eq!(store.register_table(&def).await.unwrap(), def);
    assert_eq!(store.register_table(&def).await.unwrap(), def);
    let other = TableDefinition {
        strategy: BucketStrategy::CalendarDayUtc,
        ..def.clone()
    };
    assert!(matches!(
        store.register_table(&other).await,
        Err(StoreError::TableConflict { .. })
    ));
    assert_eq!(store.table(&def.table_id).await.unwrap(), Some(def.clone()));
    assert_eq!(store.table(&tid("nope")).await.unwrap(), None);
    let second = TableDefinition {
        writable_buckets: Some(3),
        ..TableDefinition::new(tid("audit"), BucketStrategy::CalendarYearUtc, "chat")
    };
    store.register_table(&second).await.unwrap();
    assert_eq!(store.tables().await.unwrap(), vec![second, def]);
}
