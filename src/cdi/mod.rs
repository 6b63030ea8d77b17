//! The [`MetadataStore`] port on the local filesystem: device metadata files that containers
//! bind-mount (rewritten in place) and the CDI specs that the container runtime reads from
//! its CDI spec directory (replaced atomically). Both are created through a random `O_EXCL`
//! temporary and never written through a symlink or a hard link (DESIGN §7, `safe_file`).
//!
//! No fsync: the files live as long as the claims they describe, and a start puts them right
//! from the state store (a CDI dir under `/var/run` is empty after a reboot anyway).

use std::fs;
use std::io::{self, Read as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use crate::claims::metadata::MetadataStore;
use crate::model::cause::{Cause, cause};

/// Metadata files are world-readable (containers of any user read them); the runtime reads
/// the specs as root.
const FILE_MODE: u32 = 0o644;

/// Why a filesystem step failed, with the path it was on.
#[derive(Debug, thiserror::Error)]
#[error("{step} {path}: {source}")]
pub struct FileError {
    /// What was being done.
    step: &'static str,
    /// On which path.
    path: PathBuf,
    /// The OS error.
    #[source]
    source: io::Error,
}

fn failed(step: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Cause {
    let path = path.to_owned();
    move |source| cause(FileError { step, path, source })
}

/// Device metadata files and CDI specs on the local filesystem.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalFiles;

impl LocalFiles {
    fn create_parent(path: &Path) -> Result<(), Cause> {
        match path.parent() {
            Some(parent) => fs::create_dir_all(parent).map_err(failed("creating", parent)),
            None => Ok(()),
        }
    }
}

impl MetadataStore for LocalFiles {
    /// The first write creates the file through a random `O_EXCL` temporary renamed into
    /// place; later ones rewrite it in place (containers bind-mount this inode) after an
    /// `O_NOFOLLOW` open and an `fstat` check (a regular file of ours, one link), so a
    /// symlink or hard link planted there never has another file written (`safe_file`).
    fn write_in_place(&self, path: &Path, contents: &[u8]) -> Result<(), Cause> {
        Self::create_parent(path)?;
        safe_file::write_in_place(path, contents, safe_file::Options::mode(FILE_MODE))
            .map_err(cause)
    }

    /// A random `O_EXCL` temporary `<spec>.<random>.tmp` (a name the runtime's spec scan
    /// skips: it reads only `*.json` and `*.yaml`; it starts with the spec's name, so the
    /// removal of a claim's specs by prefix takes a crash's leftover too), renamed over the
    /// spec.
    fn replace(&self, path: &Path, contents: &[u8]) -> Result<(), Cause> {
        Self::create_parent(path)?;
        safe_file::replace(path, contents, safe_file::Options::mode(FILE_MODE)).map_err(cause)
    }

    /// `O_NOFOLLOW`: a symlink at a metadata path is not a file of ours, and what it points
    /// to is never read (`None`, as for a missing file: the next write refuses it, naming
    /// it). `O_NONBLOCK`: a FIFO there cannot hang the daemon.
    fn read(&self, path: &Path) -> Result<Option<Vec<u8>>, Cause> {
        let opened = fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(path);
        let mut file = match opened {
            Ok(file) => file,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(err) if err.raw_os_error() == Some(nix::libc::ELOOP) => return Ok(None),
            Err(err) => return Err(failed("reading", path)(err)),
        };
        let mut contents = Vec::new();
        file.read_to_end(&mut contents).map_err(failed("reading", path))?;
        Ok(Some(contents))
    }

    fn remove_file(&self, path: &Path) -> Result<(), Cause> {
        match fs::remove_file(path) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(failed("removing", path)(err)),
            _ => Ok(()),
        }
    }

    fn remove_dir_all(&self, path: &Path) -> Result<(), Cause> {
        match fs::remove_dir_all(path) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(failed("removing", path)(err)),
            _ => Ok(()),
        }
    }

    fn list(&self, dir: &Path) -> Result<Vec<String>, Cause> {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(err) => return Err(failed("listing", dir)(err)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(failed("listing", dir))?;
            // Names we did not write may not be UTF-8; none of ours is such a name.
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
        names.sort_unstable();
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

    use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};

    use super::*;

    #[test]
    fn a_rewrite_keeps_the_inode_and_cuts_the_old_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("claim/net/metadata.json");
        LocalFiles.write_in_place(&path, b"a much longer first version\n").unwrap();
        let inode = fs::metadata(&path).unwrap().ino();
        // A reader holding the file open (as a bind mount does) sees the new contents.
        let held = fs::File::open(&path).unwrap();
        LocalFiles.write_in_place(&path, b"second\n").unwrap();
        assert_eq!(fs::metadata(&path).unwrap().ino(), inode);
        let mut seen = vec![0; 64];
        let n = held.read_at(&mut seen, 0).unwrap();
        assert_eq!(&seen[..n], b"second\n");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o644);
    }

    #[test]
    fn a_replaced_spec_is_whole_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cdi/netclaim.dev_metadata_u1_net.json");
        LocalFiles.replace(&path, b"{\"one\":1}").unwrap();
        LocalFiles.replace(&path, b"{\"two\":2}").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"{\"two\":2}");
        assert_eq!(
            LocalFiles.list(&dir.path().join("cdi")).unwrap(),
            ["netclaim.dev_metadata_u1_net.json"]
        );
    }

    #[test]
    fn missing_files_and_directories_are_not_errors() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        assert_eq!(LocalFiles.read(&gone).unwrap(), None);
        LocalFiles.remove_file(&gone).unwrap();
        LocalFiles.remove_dir_all(&gone).unwrap();
        assert!(LocalFiles.list(&gone).unwrap().is_empty());
    }

    /// A victim file elsewhere that a hostile symlink points to, and the hostile paths.
    struct Planted {
        _dir: tempfile::TempDir,
        victim: PathBuf,
        spec: PathBuf,
        metadata: PathBuf,
    }

    fn planted() -> Planted {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("elsewhere/shadow");
        fs::create_dir_all(victim.parent().unwrap()).unwrap();
        fs::write(&victim, b"precious").unwrap();
        let spec = dir.path().join("cdi/netclaim.dev_metadata_u1_net.json");
        let metadata = dir.path().join("plugin/default_web/net/metadata.json");
        fs::create_dir_all(spec.parent().unwrap()).unwrap();
        fs::create_dir_all(metadata.parent().unwrap()).unwrap();
        Planted { _dir: dir, victim, spec, metadata }
    }

    /// The spec's old temporary was `<spec>.json.tmp`: a file planted there (world-writable,
    /// as another user would leave it) must not become the spec, and a symlink there must not
    /// have its target truncated. A symlink at the spec itself is replaced, not followed.
    #[test]
    fn a_spec_never_writes_through_a_planted_temporary_or_symlink() {
        let planted = planted();
        let guessable = planted.spec.with_extension("json.tmp");
        fs::write(&guessable, b"attacker's").unwrap();
        fs::set_permissions(&guessable, fs::Permissions::from_mode(0o666)).unwrap();
        LocalFiles.replace(&planted.spec, b"{\"spec\":1}").unwrap();
        assert_eq!(fs::read(&guessable).unwrap(), b"attacker's");
        assert_ne!(
            fs::metadata(&planted.spec).unwrap().ino(),
            fs::metadata(&guessable).unwrap().ino()
        );
        assert_eq!(fs::metadata(&planted.spec).unwrap().mode() & 0o777, 0o644);

        fs::remove_file(&guessable).unwrap();
        std::os::unix::fs::symlink(&planted.victim, &guessable).unwrap();
        fs::remove_file(&planted.spec).unwrap();
        std::os::unix::fs::symlink(&planted.victim, &planted.spec).unwrap();
        LocalFiles.replace(&planted.spec, b"{\"spec\":2}").unwrap();
        assert_eq!(fs::read(&planted.victim).unwrap(), b"precious");
        assert!(fs::symlink_metadata(&planted.spec).unwrap().is_file());
        assert_eq!(fs::read(&planted.spec).unwrap(), b"{\"spec\":2}");
    }

    /// A metadata file is rewritten in place, but never through a symlink or a hard link to a
    /// file elsewhere: the write is refused, saying why, and the other file keeps its bytes.
    #[test]
    fn a_metadata_file_is_never_written_through_a_symlink_or_a_hard_link() {
        let planted = planted();
        std::os::unix::fs::symlink(&planted.victim, &planted.metadata).unwrap();
        let err = LocalFiles.write_in_place(&planted.metadata, b"{}\n").unwrap_err();
        assert!(crate::model::cause::chain(&*err).contains("symbolic link"), "{err}");
        assert_eq!(fs::read(&planted.victim).unwrap(), b"precious");
        // Nor is what it points to read as our file.
        assert_eq!(LocalFiles.read(&planted.metadata).unwrap(), None);

        fs::remove_file(&planted.metadata).unwrap();
        fs::hard_link(&planted.victim, &planted.metadata).unwrap();
        let err = LocalFiles.write_in_place(&planted.metadata, b"{}\n").unwrap_err();
        assert!(crate::model::cause::chain(&*err).contains("hard links"), "{err}");
        assert_eq!(fs::read(&planted.victim).unwrap(), b"precious");
    }

    /// A metadata file someone else created (another owner) is not ours to rewrite: refused,
    /// and its bytes stay. Making a file of another owner needs root.
    #[test]
    fn a_metadata_file_of_another_owner_is_refused() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let planted = planted();
        fs::write(&planted.metadata, b"attacker's").unwrap();
        std::os::unix::fs::chown(&planted.metadata, Some(65534), Some(65534)).unwrap();
        let err = LocalFiles.write_in_place(&planted.metadata, b"{}\n").unwrap_err();
        assert!(crate::model::cause::chain(&*err).contains("owned by uid 65534"), "{err}");
        assert_eq!(fs::read(&planted.metadata).unwrap(), b"attacker's");
    }

    #[test]
    fn errors_name_the_step_and_path() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain");
        fs::write(&file, b"x").unwrap();
        // A file where a directory is needed.
        let err = LocalFiles.write_in_place(&file.join("sub/metadata.json"), b"y").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("creating") && text.contains("plain/sub"), "{text}");
    }
}
