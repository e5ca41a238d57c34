//! Fixtures shared by the embedded store's unit tests: names, records and a migrated
//! in-memory store with one table, so each role file's tests start from the same place.

use crate::model::{EventTime, PartitionKey, Record, SortKey, TableId};
use crate::store::{Catalog, TableDefinition};

use super::SqliteStore;

pub(super) fn tid(s: &str) -> TableId {
    TableId::new(s).unwrap()
}

pub(super) fn rec(pk: &[u8], micros: i64, sk: &[u8], v: &[u8]) -> Record {
    Record {
        partition_key: PartitionKey::new(pk.to_vec()).unwrap(),
        event_time: EventTime::from_micros(micros).unwrap(),
        sort_key: SortKey::new(sk.to_vec()).unwrap(),
        value: v.to_vec(),
    }
}

/// A migrated in-memory store with `def` registered.
pub(super) async fn store_with(def: &TableDefinition) -> SqliteStore {
    let s = SqliteStore::open_in_memory().unwrap();
    s.migrate().await.unwrap();
    s.register_table(def).await.unwrap();
    s
}
