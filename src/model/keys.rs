//! Table ids, opaque partition and sort keys, and the record they identify.

use std::fmt;

use super::{EventTime, ModelError};

/// Longest partition or sort key, in bytes. Keys are part of the hot store's primary key and
/// of archive object keys (hex-encoded), so they are kept small.
pub const MAX_KEY_LEN: usize = 512;

/// Longest table id, in characters.
pub const MAX_TABLE_ID_LEN: usize = 63;

/// A validated table id: 1..=63 characters of `[a-z0-9_]`, starting with a letter. The
/// restriction keeps it safe as an object-key path segment and as a SQL identifier.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TableId(String);

impl TableId {
    /// Validates and wraps a table id.
    pub fn new(id: impl Into<String>) -> Result<Self, ModelError> {
        let id = id.into();
        let err = |reason| ModelError::InvalidTableId {
            id: id.clone(),
            reason,
        };
        if id.is_empty() {
            return Err(err("empty"));
        }
        if id.len() > MAX_TABLE_ID_LEN {
            return Err(err("longer than 63 characters"));
        }
        if !id.starts_with(|c: char| c.is_ascii_lowercase()) {
            return Err(err("must start with a lowercase letter"));
        }
        if !id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(err("only lowercase letters, digits and '_' are allowed"));
        }
        Ok(Self(id))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TableId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An opaque partition key of 1..=[`MAX_KEY_LEN`] bytes. It must not be empty because it
/// names a path segment of archive objects.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartitionKey(Vec<u8>);

impl PartitionKey {
    /// Validates and wraps the bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, ModelError> {
        let bytes = bytes.into();
        if bytes.is_empty() {
            return Err(ModelError::InvalidKey {
                kind: "partition",
                len: 0,
                reason: "must not be empty",
            });
        }
        if bytes.len() > MAX_KEY_LEN {
            return Err(ModelError::InvalidKey {
                kind: "partition",
                len: bytes.len(),
                reason: "longer than 512 bytes",
            });
        }
        Ok(Self(bytes))
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Lowercase hex, as used in object keys and messages.
    pub fn to_hex(&self) -> String {
        hex::encode(&self.0)
    }

    /// Parses lowercase or uppercase hex.
    pub fn from_hex(s: &str) -> Result<Self, ModelError> {
        let bytes = hex::decode(s).map_err(|_| ModelError::InvalidKey {
            kind: "partition",
            len: s.len(),
            reason: "not valid hex",
        })?;
        Self::new(bytes)
    }
}

impl fmt::Display for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{}", self.to_hex())
    }
}

/// An opaque sort key of 0..=[`MAX_KEY_LEN`] bytes; it orders records that share an event
/// time, bytewise.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SortKey(Vec<u8>);

impl SortKey {
    /// Validates and wraps the bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, ModelError> {
        let bytes = bytes.into();
        Self::check(&bytes)?;
        Ok(Self(bytes))
    }

    /// Validates sort-key bytes without taking them (for rows decoded straight into a
    /// batch).
    pub fn check(bytes: &[u8]) -> Result<(), ModelError> {
        if bytes.len() > MAX_KEY_LEN {
            return Err(ModelError::InvalidKey {
                kind: "sort",
                len: bytes.len(),
                reason: "longer than 512 bytes",
            });
        }
        Ok(())
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Display for SortKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{}", hex::encode(&self.0))
    }
}

/// One record of the core contract: `(partition_key, event_time, sort_key) -> value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The partition (for chat: the channel).
    pub partition_key: PartitionKey,
    /// The leading clustering component; it selects the time bucket.
    pub event_time: EventTime,
    /// The second clustering component (for chat: the message id).
    pub sort_key: SortKey,
    /// The opaque payload (for chat: the message body).
    pub value: Vec<u8>,
}

impl Record {
    /// The record's position inside its bucket.
    pub fn clustering_key(&self) -> super::ClusteringKey {
        super::ClusteringKey {
            event_time: self.event_time,
            sort_key: self.sort_key.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_ids_are_validated() {
        assert!(TableId::new("chat_messages").is_ok());
        for bad in ["", "Chat", "1abc", "a-b", "a b", &"x".repeat(64)] {
            assert!(
                matches!(TableId::new(bad), Err(ModelError::InvalidTableId { .. })),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn keys_have_a_maximum_length() {
        assert!(PartitionKey::new(vec![1; MAX_KEY_LEN]).is_ok());
        assert!(PartitionKey::new(vec![1; MAX_KEY_LEN + 1]).is_err());
        assert!(PartitionKey::new(Vec::new()).is_err());
        assert!(SortKey::new(Vec::new()).is_ok());
        assert!(SortKey::new(vec![1; MAX_KEY_LEN + 1]).is_err());
        let pk = PartitionKey::new(vec![0xab, 0x01]).unwrap();
        assert_eq!(PartitionKey::from_hex(&pk.to_hex()).unwrap(), pk);
        assert!(PartitionKey::from_hex("zz").is_err());
    }
}
