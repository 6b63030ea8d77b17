//! Writing files where someone else may have been first: in a directory other users can
//! write to (`/tmp`), or one whose entries a compromised or careless process may have
//! replaced with symbolic links.
//!
//! - [`replace`] puts a whole new file at a path: a temporary with a random name is created
//!   next to it with `O_CREAT|O_EXCL` (the kernel then refuses an existing name, a symlink
//!   included, so nothing planted at a guessable name is ever opened), given its mode through
//!   the descriptor before any byte is written, filled, and renamed over the target. A rename
//!   replaces a symlink at the target instead of following it.
//! - [`write_in_place`] rewrites an existing file without changing its inode (a file that is
//!   bind-mounted somewhere must stay the same file): it is opened with `O_NOFOLLOW` and
//!   accepted only if `fstat` says it is a regular file owned by this process's effective user
//!   with a single link (a hard link to a file elsewhere would have that file rewritten). A
//!   missing file is created as [`replace`] does, without replacing one that appeared meanwhile.
//!
//! Only the last path component is guarded: the directories leading to it are the caller's
//! to trust (created by the caller, or owned by root).

use std::fs::{File, OpenOptions, Permissions};
use std::io::{self, Write as _};
use std::os::unix::fs::{FileExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use nix::libc;

/// Random characters in a temporary's name (62 possible each: guessing one is hopeless).
const RANDOM_CHARS: usize = 12;

/// Why a file could not be written safely.
#[derive(Debug, thiserror::Error)]
pub enum SafeFileError {
    /// The path names no file in a directory (`/`, `..`, empty).
    #[error("{path}: not a file path")]
    NotAFilePath {
        /// The path.
        path: PathBuf,
    },
    /// The temporary could not be created in the target's directory.
    #[error("creating a temporary file in {dir}: {source}")]
    Temporary {
        /// The directory.
        dir: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Setting the mode, writing, truncating or syncing failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The file written (the temporary, or the target rewritten in place).
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The temporary could not be renamed over the target.
    #[error("renaming {from} to {to}: {source}")]
    Rename {
        /// The temporary (removed again).
        from: PathBuf,
        /// The target.
        to: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The target could not be opened for an in-place rewrite.
    #[error("opening {path}: {source}")]
    Open {
        /// The target.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The target is a symbolic link (refused: it would write wherever the link points).
    #[error("refusing to write {path}: it is a symbolic link")]
    Symlink {
        /// The target.
        path: PathBuf,
    },
    /// The target is not a regular file (a directory, FIFO, device or socket).
    #[error("refusing to write {path}: not a regular file")]
    NotRegular {
        /// The target.
        path: PathBuf,
    },
    /// The target belongs to another user (someone else made it).
    #[error("refusing to write {path}: owned by uid {owner}, not by uid {us}")]
    ForeignOwner {
        /// The target.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// This process's effective uid.
        us: u32,
    },
    /// The target has more than one name (a hard link to a file elsewhere).
    #[error("refusing to write {path}: it has {links} hard links")]
    HardLinked {
        /// The target.
        path: PathBuf,
        /// Its link count.
        links: u64,
    },
}

/// How a new file is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Permission bits, set exactly (the umask does not apply).
    pub mode: u32,
    /// `fsync` the file before it is renamed into place, so a crash leaves the old or the new
    /// contents, never an empty file.
    pub sync: bool,
}

impl Options {
    /// Mode `mode`, no fsync.
    #[must_use]
    pub fn mode(mode: u32) -> Self {
        Self { mode, sync: false }
    }

    /// The same, with an fsync before the rename.
    #[must_use]
    pub fn synced(self) -> Self {
        Self { sync: true, ..self }
    }
}

/// Writes `contents` to a new file that replaces whatever `path` named (a file, or a symlink,
/// which is replaced and not followed). Readers see the old file or the new one, never a
/// partial one. The temporary is named `<file name>.<random>.tmp` (so a caller that cleans up
/// by the target's name prefix finds a leftover of a crash) and removed again on failure.
pub fn replace(path: &Path, contents: &[u8], options: Options) -> Result<(), SafeFileError> {
    let temporary = filled_temporary(path, contents, options)?;
    let from = temporary.path().to_owned();
    temporary.persist(path).map(drop).map_err(|err| SafeFileError::Rename {
        from,
        to: path.to_owned(),
        source: err.error,
    })
}

/// Rewrites the file at `path` in place (same inode, so a bind mount of it shows the new
/// contents) after checking it through its descriptor (see the crate docs); creates it as
/// [`replace`] does when it does not exist. The old contents are overwritten first and the
/// tail cut afterwards, without `O_TRUNC`: a reader in between sees the old document, or
/// the new one followed by the old one's tail, never an empty file.
pub fn write_in_place(path: &Path, contents: &[u8], options: Options) -> Result<(), SafeFileError> {
    // Twice at most: a file created by someone else between our open and our create is
    // opened (and checked) on the second round.
    for _ in 0..2 {
        if let Some(file) = open_checked(path)? {
            return rewrite(&file, path, contents, options);
        }
        if create_new(path, contents, options)? {
            return Ok(());
        }
    }
    // Created by someone else, then removed again before we could open it: give up rather
    // than race on.
    Err(SafeFileError::Open {
        path: path.to_owned(),
        source: io::Error::from(io::ErrorKind::AlreadyExists),
    })
}

/// Overwrites the opened `file` from its start and cuts what is left of the old contents.
fn rewrite(
    file: &File,
    path: &Path,
    contents: &[u8],
    options: Options,
) -> Result<(), SafeFileError> {
    let write = |source| SafeFileError::Write { path: path.to_owned(), source };
    file.write_all_at(contents, 0).map_err(write)?;
    file.set_len(contents.len() as u64).map_err(write)?;
    if options.sync {
        file.sync_all().map_err(write)?;
    }
    Ok(())
}

/// Creates `path` through a temporary unless it exists by then; `false` when it did.
fn create_new(path: &Path, contents: &[u8], options: Options) -> Result<bool, SafeFileError> {
    let temporary = filled_temporary(path, contents, options)?;
    let from = temporary.path().to_owned();
    match temporary.persist_noclobber(path) {
        Ok(_) => Ok(true),
        Err(err) if err.error.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(err) => Err(SafeFileError::Rename { from, to: path.to_owned(), source: err.error }),
    }
}

/// A random `O_EXCL` temporary next to `path` with `contents` and `options.mode`.
fn filled_temporary(
    path: &Path,
    contents: &[u8],
    options: Options,
) -> Result<tempfile::NamedTempFile, SafeFileError> {
    let (dir, name) = split(path)?;
    let prefix = format!("{}.", name.to_string_lossy());
    // Created 0600 (tempfile's O_CREAT|O_EXCL open); the final mode is set on the descriptor
    // before the first byte, so no other user can open it meanwhile and the umask does not
    // narrow what the caller asked for.
    let mut temporary = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .rand_bytes(RANDOM_CHARS)
        .permissions(Permissions::from_mode(0o600))
        .tempfile_in(dir)
        .map_err(|source| SafeFileError::Temporary { dir: dir.to_owned(), source })?;
    let write = |source| SafeFileError::Write { path: path.to_owned(), source };
    temporary.as_file().set_permissions(Permissions::from_mode(options.mode)).map_err(write)?;
    temporary.write_all(contents).map_err(write)?;
    if options.sync {
        temporary.as_file().sync_all().map_err(write)?;
    }
    Ok(temporary)
}

fn split(path: &Path) -> Result<(&Path, &std::ffi::OsStr), SafeFileError> {
    let not_a_file = || SafeFileError::NotAFilePath { path: path.to_owned() };
    let name = path.file_name().ok_or_else(not_a_file)?;
    let dir = match path.parent() {
        Some(parent) if parent.as_os_str().is_empty() => Path::new("."),
        Some(parent) => parent,
        None => return Err(not_a_file()),
    };
    Ok((dir, name))
}

/// Opens `path` for writing without following a symlink and checks what it is; `None` when
/// it does not exist.
fn open_checked(path: &Path) -> Result<Option<File>, SafeFileError> {
    // O_NONBLOCK: opening a FIFO for writing would otherwise wait for a reader; it is
    // refused by the check below instead. On a regular file it changes nothing.
    let opened = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let file = match opened {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        // open(2): O_NOFOLLOW on a symlink fails with ELOOP.
        Err(err) if err.raw_os_error() == Some(libc::ELOOP) => {
            return Err(SafeFileError::Symlink { path: path.to_owned() });
        }
        // A FIFO without a reader (O_NONBLOCK write open) and a socket are not files either.
        Err(err) if matches!(err.raw_os_error(), Some(libc::ENXIO | libc::EISDIR)) => {
            return Err(SafeFileError::NotRegular { path: path.to_owned() });
        }
        Err(source) => return Err(SafeFileError::Open { path: path.to_owned(), source }),
    };
    let stat =
        file.metadata().map_err(|source| SafeFileError::Open { path: path.to_owned(), source })?;
    let seen = Seen { regular: stat.is_file(), owner: stat.uid(), links: stat.nlink() };
    seen.check(path, nix::unistd::geteuid().as_raw())?;
    Ok(Some(file))
}

/// What `fstat` said about an opened target.
#[derive(Debug, Clone, Copy)]
struct Seen {
    regular: bool,
    owner: u32,
    links: u64,
}

impl Seen {
    fn check(self, path: &Path, us: u32) -> Result<(), SafeFileError> {
        let path = || path.to_owned();
        if !self.regular {
            return Err(SafeFileError::NotRegular { path: path() });
        }
        if self.owner != us {
            return Err(SafeFileError::ForeignOwner { path: path(), owner: self.owner, us });
        }
        if self.links != 1 {
            return Err(SafeFileError::HardLinked { path: path(), links: self.links });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

    use std::os::unix::fs::symlink;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().mode() & 0o7777
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| Path::new(n).extension().is_some_and(|e| e == "tmp"))
            .collect()
    }

    #[test]
    fn replace_sets_the_exact_mode_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        replace(&path, b"one", Options::mode(0o644).synced()).unwrap();
        replace(&path, b"two", Options::mode(0o640)).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(mode(&path), 0o640);
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn replace_puts_a_file_where_a_symlink_was_and_leaves_its_target_alone() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let path = dir.path().join("config");
        symlink(&victim, &path).unwrap();
        replace(&path, b"secret", Options::mode(0o600)).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.is_file(), "{meta:?}");
        assert_eq!(std::fs::read(&path).unwrap(), b"secret");
    }

    #[test]
    fn a_failed_rename_removes_the_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        // A non-empty directory at the target: rename(2) fails.
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("x"), b"").unwrap();
        let err = replace(&path, b"secret", Options::mode(0o600)).unwrap_err();
        assert!(matches!(err, SafeFileError::Rename { .. }), "{err}");
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn in_place_keeps_the_inode_and_creates_a_missing_file_with_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metadata.json");
        write_in_place(&path, b"a longer first version", Options::mode(0o644)).unwrap();
        assert_eq!(mode(&path), 0o644);
        let inode = std::fs::metadata(&path).unwrap().ino();
        write_in_place(&path, b"second", Options::mode(0o644)).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), inode);
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn in_place_refuses_a_symlink_and_leaves_its_target_whole() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let path = dir.path().join("metadata.json");
        symlink(&victim, &path).unwrap();
        let err = write_in_place(&path, b"x", Options::mode(0o644)).unwrap_err();
        assert!(matches!(err, SafeFileError::Symlink { .. }), "{err}");
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    }

    #[test]
    fn in_place_refuses_a_hard_link_a_fifo_and_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let linked = dir.path().join("linked.json");
        std::fs::hard_link(&victim, &linked).unwrap();
        let err = write_in_place(&linked, b"x", Options::mode(0o644)).unwrap_err();
        assert!(matches!(err, SafeFileError::HardLinked { links: 2, .. }), "{err}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");

        let fifo = dir.path().join("fifo.json");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let err = write_in_place(&fifo, b"x", Options::mode(0o644)).unwrap_err();
        assert!(matches!(err, SafeFileError::NotRegular { .. }), "{err}");

        let sub = dir.path().join("dir.json");
        std::fs::create_dir(&sub).unwrap();
        let err = write_in_place(&sub, b"x", Options::mode(0o644)).unwrap_err();
        assert!(matches!(err, SafeFileError::NotRegular { .. }), "{err}");
    }

    #[test]
    fn in_place_refuses_a_file_of_another_owner() {
        let seen = Seen { regular: true, owner: 65534, links: 1 };
        let err = seen.check(Path::new("/m"), 0).unwrap_err();
        assert_eq!(err.to_string(), "refusing to write /m: owned by uid 65534, not by uid 0");
        assert!(Seen { owner: 0, ..seen }.check(Path::new("/m"), 0).is_ok());
        // Root can make such a file for real: the whole path refuses it too.
        if nix::unistd::geteuid().is_root() {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("metadata.json");
            std::fs::write(&path, b"theirs").unwrap();
            std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
            let err = write_in_place(&path, b"ours", Options::mode(0o644)).unwrap_err();
            assert!(matches!(err, SafeFileError::ForeignOwner { owner: 65534, .. }), "{err}");
            assert_eq!(std::fs::read(&path).unwrap(), b"theirs");
        }
    }

    #[test]
    fn a_path_without_a_file_name_is_refused() {
        let err = replace(Path::new("/"), b"x", Options::mode(0o600)).unwrap_err();
        assert!(matches!(err, SafeFileError::NotAFilePath { .. }), "{err}");
    }
}
