//! Durable, crash-safe record store under the state dir: an append-only, checksummed journal
//! with group-committed `fdatasync`s, an in-memory index, and a versioned format with a
//! migration path.
//!
//! Layout: `<state-dir>/journal` (and `<state-dir>/LOCK`). The first line is a header
//! `{"format":"netclaim-state","version":4}`; every further line is one committed batch,
//! `<16 hex digits of SHA-256> <json>\n`, the JSON being `{"ops":[...]}` with `put`
//! (`kind`, `key`, record `version`, `data`) and `remove` (`kind`, `key`) operations.
//!
//! A commit appends one line and `fdatasync`s before returning (group commit: one
//! `fdatasync` outside the journal lock serves every line appended before it, and the commit
//! that runs it first waits a moment for commits announced ahead, `group`), so an
//! acknowledged record survives `kill -9` and power loss; a buffered commit
//! ([`Durability::Buffered`]) only appends, and survives `kill -9` but not power loss. A
//! batch is all or nothing: a `kill -9` in the middle of an append leaves a last line
//! without its newline, which the next open drops (and truncates). A complete line whose checksum does not match is corruption and fails
//! the open, naming the offset: silently forgetting a lease could give its address to a
//! second claim. When the journal grows past twice its live size it is compacted (written
//! to a temp file, fsynced, renamed over the journal, directory fsynced). A `LOCK` file
//! (flock) keeps a second daemon off the same state dir. Why this and not one file per
//! record or an embedded database: `docs/decisions/0002-state-store.md`.
//!
//! All calls block on disk I/O: async callers use `spawn_blocking`.

mod attachments;
mod claims;
mod disk;
mod error;
mod ethtool_snapshots;
mod format;
mod group;
mod journal;
mod leases;
mod record;
mod vf_snapshots;
mod vfio_bindings;

#[cfg(test)]
mod burst_tests;
#[cfg(test)]
mod fault_tests;
// Also under `testkit`: `testing::sim_store` runs whole claim services on it (the IPAM
// simulation); some of its fault knobs are only used by the store's own tests.
#[cfg(any(test, feature = "testkit"))]
#[cfg_attr(
    not(test),
    allow(
        dead_code,
        clippy::assigning_clones,
        reason = "the store's fault tests use every knob, the simulation a few; its page-cache copies are lint-clean under cfg(test) only"
    )
)]
pub(crate) mod sim_disk;
#[cfg(test)]
mod tests;

pub use error::StoreError;
pub use format::FORMAT_VERSION;
pub use group::CommitNotice;
pub use journal::{Durability, Store};
pub use record::{Batch, Record};
