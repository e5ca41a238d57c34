//! The raw surface: the envelope as it is, `partition_key BYTEA, event_time TIMESTAMPTZ,
//! sort_key BYTEA, value BYTEA`, for tables whose keys are not integers.

use datafusion::arrow::array::{ArrayRef, BinaryArray};
use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::scalar::ScalarValue;

use super::{bytes_of, downcast, Role, SurfaceKind};
use crate::model::{PartitionKey, SortKey};
use crate::provider::ProviderError;

/// The raw surface.
pub(super) struct Raw;

impl SurfaceKind for Raw {
    fn name(&self) -> &'static str {
        "raw"
    }

    fn column_names(&self) -> [&'static str; 4] {
        ["partition_key", "event_time", "sort_key", "value"]
    }

    fn key_field(&self, role: Role) -> Field {
        let name = self.column_names()[role.index()];
        Field::new(name, DataType::Binary, false)
    }

    fn column_from_envelope(
        &self,
        _role: Role,
        column: &ArrayRef,
    ) -> Result<ArrayRef, ProviderError> {
        Ok(column.clone())
    }

    fn envelope_bytes(
        &self,
        role: Role,
        column: &ArrayRef,
        row: usize,
    ) -> Result<Vec<u8>, ProviderError> {
        let name = self.column_names()[role.index()];
        Ok(downcast::<BinaryArray>(column, name)?.value(row).to_vec())
    }

    fn partition_of(&self, v: &ScalarValue) -> Option<PartitionKey> {
        // An empty or oversized key can match no stored row, but it is not a key we can
        // name in a bucket listing: leave such filters to DataFusion.
        PartitionKey::new(bytes_of(v)?).ok()
    }

    fn sort_key_of(&self, v: &ScalarValue) -> Option<SortKey> {
        SortKey::new(bytes_of(v)?).ok()
    }

    fn display_key(&self, key: &[u8]) -> String {
        format!("0x{}", hex::encode(key))
    }
}
