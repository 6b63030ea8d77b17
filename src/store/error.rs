//! Why a store operation failed.

use std::io;
use std::path::{Path, PathBuf};

use super::FORMAT_VERSION;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file system call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Another process holds the state dir.
    #[error("state dir {path} is locked by another process")]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// The journal is damaged (not just a torn last line).
    #[error("corrupt journal {path} at byte {offset}: {reason}")]
    Corrupt {
        /// The journal.
        path: PathBuf,
        /// Where the bad line starts.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// The journal was written by a newer netclaim (a rollback): the message names both
    /// formats and the two ways on (docs/operations.md, "Rolling back").
    #[error(
        "state dir {dir} is format {version}, this release reads up to format {FORMAT_VERSION}: \
         run the newer release, or unprepare every claim on this node (drain it) and remove \
         {dir} before rolling back",
        dir = state_dir(.path).display()
    )]
    NewerFormat {
        /// The journal.
        path: PathBuf,
        /// Its format version.
        version: u32,
    },
    /// A record does not decode into its type.
    #[error("decode {kind} record {key:?}: {source}")]
    Decode {
        /// Record kind.
        kind: &'static str,
        /// Record key.
        key: String,
        /// The decoder's message.
        #[source]
        source: serde_json::Error,
    },
    /// A record could not be encoded.
    #[error("encode {kind} record {key:?}: {source}")]
    Encode {
        /// Record kind.
        kind: &'static str,
        /// Record key.
        key: String,
        /// The encoder's message.
        #[source]
        source: serde_json::Error,
    },
    /// A record written by a newer netclaim.
    #[error("{kind} record {key:?} has version {version}, newer than {supported} (downgrade?)")]
    NewerVersion {
        /// Record kind.
        kind: &'static str,
        /// Record key.
        key: String,
        /// Its version.
        version: u32,
        /// The newest this build reads.
        supported: u32,
    },
    /// A migration step failed.
    #[error("migrate {kind} record {key:?} from version {from}: {reason}")]
    Migrate {
        /// Record kind.
        kind: &'static str,
        /// Record key.
        key: String,
        /// The version the failing step starts from.
        from: u32,
        /// What went wrong.
        reason: String,
    },
    /// A record's key does not fit its content (checked by record kinds that derive keys).
    #[error("{kind} record {key:?} does not match its content")]
    KeyMismatch {
        /// Record kind.
        kind: &'static str,
        /// The key.
        key: String,
    },
    /// An empty key.
    #[error("empty {kind} record key")]
    EmptyKey {
        /// Record kind.
        kind: &'static str,
    },
    /// A failed append could not be rolled back; the store refuses further writes.
    #[error("journal {path} is in an unknown state after a failed write; restart to recover")]
    Poisoned {
        /// The journal.
        path: PathBuf,
    },
}

/// The state dir of journal `path`.
fn state_dir(path: &Path) -> &Path {
    path.parent().unwrap_or(path)
}

pub(super) fn io_err<'p>(
    op: &'static str,
    path: &'p Path,
) -> impl FnOnce(io::Error) -> StoreError + 'p {
    move |source| StoreError::Io { op, path: path.to_path_buf(), source }
}
