//! The [`MetadataStore`] port on the local filesystem: device metadata files that containers
//! bind-mount (rewritten in place) and the CDI specs that the container runtime reads from
//! its CDI spec directory (replaced atomically).
//!
//! No fsync: the files live as long as the claims they describe, and a start puts them right
//! from the state store (a CDI dir under `/var/run` is empty after a reboot anyway).

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
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
    fn write_in_place(&self, path: &Path, contents: &[u8]) -> Result<(), Cause> {
        Self::create_parent(path)?;
        // No O_TRUNC: a reader between the truncate and the write would see an empty file.
        // Writing over the old contents first and cutting the tail afterwards leaves a
        // reader either the old or the new document, or (for a moment) the new document
        // followed by the old one's tail, which a JSON stream reader stops before.
        let file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(FILE_MODE)
            .open(path)
            .map_err(failed("opening", path))?;
        file.write_all_at(contents, 0).map_err(failed("writing", path))?;
        file.set_len(contents.len() as u64).map_err(failed("truncating", path))
    }

    fn replace(&self, path: &Path, contents: &[u8]) -> Result<(), Cause> {
        Self::create_parent(path)?;
        // A name the runtime's spec scan skips (it reads only `*.json` and `*.yaml`).
        let temporary = path.with_extension("json.tmp");
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(FILE_MODE)
            .open(&temporary)
            .map_err(failed("creating", &temporary))?;
        if let Err(err) = file.write_all(contents) {
            let _ignored = fs::remove_file(&temporary);
            return Err(failed("writing", &temporary)(err));
        }
        drop(file);
        fs::rename(&temporary, path).map_err(|err| {
            let _ignored = fs::remove_file(&temporary);
            failed("renaming into", path)(err)
        })
    }

    fn read(&self, path: &Path) -> Result<Option<Vec<u8>>, Cause> {
        match fs::read(path) {
            Ok(contents) => Ok(Some(contents)),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(failed("reading", path)(err)),
        }
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

    use std::os::unix::fs::MetadataExt;

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
