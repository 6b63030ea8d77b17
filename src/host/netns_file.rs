//! Opening a network namespace file that someone else named (the runtime's netns path of a
//! pod) without being tricked into opening something else, and comparing two of them.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::podnet::ports::{LinkOpError, NetnsRefusal};

/// `ENOENT`: the netns path does not exist (the sandbox is gone).
const ENOENT: i32 = 2;

/// Opens a network namespace file named by someone else (the runtime's netns path):
/// `O_NONBLOCK` so a FIFO cannot hang the thread, `O_NOFOLLOW` so a symlink planted at the
/// path is not followed, and only a file of the namespace file system (`nsfs`) is accepted.
/// That it is a *network* namespace is checked by `setns(CLONE_NEWNET)`, which the kernel
/// refuses with `EINVAL` for any other kind (the same check as `NS_GET_NSTYPE`, without an
/// unsafe ioctl).
pub(super) fn open_netns_file(path: &Path) -> Result<File, LinkOpError> {
    let display = || path.display().to_string();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(|source| match source.raw_os_error() {
            Some(ENOENT) => LinkOpError::NetnsGone { path: display() },
            Some(nix::libc::ELOOP) => {
                LinkOpError::NotPodNetns { path: display(), reason: NetnsRefusal::Symlink }
            }
            _ => LinkOpError::Netns { path: display(), source },
        })?;
    let fs = nix::sys::statfs::fstatfs(&file)
        .map_err(|errno| LinkOpError::Netns { path: display(), source: errno.into() })?;
    if fs.filesystem_type() != nix::sys::statfs::NSFS_MAGIC {
        return Err(LinkOpError::NotPodNetns { path: display(), reason: NetnsRefusal::NotNsfs });
    }
    Ok(file)
}

/// Whether two open files are the same namespace (same device and inode, as `ip netns
/// identify` compares them).
pub(super) fn same_namespace(a: &File, b: &File) -> Result<bool, nix::Error> {
    let (a, b) = (nix::sys::stat::fstat(a)?, nix::sys::stat::fstat(b)?);
    Ok((a.st_dev, a.st_ino) == (b.st_dev, b.st_ino))
}
