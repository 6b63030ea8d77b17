//! What the store keeps and commits: a kind of record with its schema version, and a batch of
//! puts and removes committed together.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::StoreError;
use super::format::Op;

/// A kind of record kept in the store, with its schema version.
pub trait Record: Serialize + DeserializeOwned {
    /// Name of this kind (`claims`, `ipam-leases`); keys are unique per kind.
    const KIND: &'static str;
    /// Version of the `data` schema written now.
    const VERSION: u32;

    /// Upgrades `data` written at version `from` (< [`Record::VERSION`]) to version
    /// `from + 1`. The store applies it step by step on load and writes the result back.
    fn migrate(from: u32, data: Value) -> Result<Value, String> {
        let _ = data;
        Err(format!("no migration from version {from}"))
    }
}

/// Changes committed together: all or none survive a crash.
#[derive(Debug, Default)]
pub struct Batch {
    pub(super) ops: Vec<Op>,
}

impl Batch {
    /// An empty batch.
    #[must_use]
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Adds a create-or-replace of `key`.
    pub fn put<R: Record>(&mut self, key: &str, record: &R) -> Result<&mut Batch, StoreError> {
        check_key::<R>(key)?;
        let data = serde_json::value::to_raw_value(record)
            .map_err(|source| StoreError::Encode { kind: R::KIND, key: key.to_owned(), source })?;
        self.ops.push(Op::Put {
            kind: R::KIND.to_owned(),
            key: key.to_owned(),
            version: R::VERSION,
            data,
        });
        Ok(self)
    }

    /// Adds a removal of `key` (a no-op if there is none).
    pub fn remove<R: Record>(&mut self, key: &str) -> Result<&mut Batch, StoreError> {
        check_key::<R>(key)?;
        self.ops.push(Op::Remove { kind: R::KIND.to_owned(), key: key.to_owned() });
        Ok(self)
    }

    /// Whether the batch holds no change.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

pub(super) fn check_key<R: Record>(key: &str) -> Result<(), StoreError> {
    if key.is_empty() { Err(StoreError::EmptyKey { kind: R::KIND }) } else { Ok(()) }
}
