//! Named network namespaces (the dev kubelet's bare pod sandboxes, the demo's peer): created
//! on a dedicated OS thread (`unshare(CLONE_NEWNET)`, then a bind mount of the thread's netns
//! onto a file under the run dir, as `ip netns add` does), removed by unmounting that file,
//! and entered by a thread of its own to run one blocking job (as `ip netns exec` does).
//!
//! The bind mount keeps the namespace alive after the thread ends; unmounting drops the last
//! reference, and the kernel then destroys the namespace with every virtual link inside it.

use std::path::{Path, PathBuf};

/// Errors creating or removing a namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// A file system step failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What we did.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A syscall failed.
    #[error("{call} for {path}: {source}")]
    Sys {
        /// `unshare(CLONE_NEWNET)`, `setns(CLONE_NEWNET)`, `mount(MS_BIND)`, `umount2(MNT_DETACH)`.
        call: &'static str,
        /// The namespace file.
        path: PathBuf,
        /// The errno.
        #[source]
        source: nix::errno::Errno,
    },
    /// The namespace thread could not run.
    #[error("the netns thread for {0} died")]
    Thread(PathBuf),
}

/// Runs `job` on a new OS thread that has entered the network namespace at `path` (the
/// thread ends with the job, so no other work ever runs in that namespace; `setns` changes
/// only the calling thread, never a tokio worker). Child processes the job spawns inherit
/// the namespace. Blocking: call from `spawn_blocking` or a plain thread.
pub fn run_in<T: Send + 'static>(
    path: &Path,
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T, NetnsError> {
    let owned = path.to_owned();
    std::thread::Builder::new()
        .name("netns-run".to_owned())
        .spawn(move || -> Result<T, NetnsError> {
            let file = std::fs::File::open(&owned).map_err(|source| NetnsError::Io {
                action: "opening",
                path: owned.clone(),
                source,
            })?;
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|source| {
                NetnsError::Sys { call: "setns(CLONE_NEWNET)", path: owned, source }
            })?;
            Ok(job())
        })
        .map_err(|source| NetnsError::Io {
            action: "spawning the netns thread for",
            path: path.to_owned(),
            source,
        })?
        .join()
        .map_err(|_| NetnsError::Thread(path.to_owned()))?
}

/// Creates a new network namespace pinned at `dir/name` (the directory is created as needed)
/// and returns its path. Blocking: call from `spawn_blocking` or a plain thread.
pub fn create(dir: &Path, name: &str) -> Result<PathBuf, NetnsError> {
    std::fs::create_dir_all(dir).map_err(|source| NetnsError::Io {
        action: "creating",
        path: dir.to_owned(),
        source,
    })?;
    let path = dir.join(name);
    std::fs::OpenOptions::new().write(true).create_new(true).open(&path).map_err(|source| {
        NetnsError::Io { action: "creating the mount point", path: path.clone(), source }
    })?;
    let target = path.clone();
    // unshare changes the namespace of the calling thread for good: a thread of its own that
    // ends right after the bind mount, never a tokio worker.
    let result = std::thread::Builder::new()
        .name("netns-create".to_owned())
        .spawn(move || -> Result<(), NetnsError> {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(|source| {
                NetnsError::Sys { call: "unshare(CLONE_NEWNET)", path: target.clone(), source }
            })?;
            nix::mount::mount(
                Some("/proc/thread-self/ns/net"),
                &target,
                None::<&str>,
                nix::mount::MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|source| NetnsError::Sys {
                call: "mount(MS_BIND)",
                path: target,
                source,
            })
        })
        .map_err(|source| NetnsError::Io {
            action: "spawning the netns thread for",
            path: path.clone(),
            source,
        })?
        .join()
        .map_err(|_| NetnsError::Thread(path.clone()))
        .and_then(|r| r);
    if let Err(err) = result {
        let _ignored = std::fs::remove_file(&path);
        return Err(err);
    }
    Ok(path)
}

/// Unmounts and removes a namespace made by [`create`]; a path that is gone is fine.
pub fn remove(path: &Path) -> Result<(), NetnsError> {
    if !path.exists() {
        return Ok(());
    }
    match nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH) {
        // EINVAL: not a mount point (a create that failed half-way).
        Ok(()) | Err(nix::errno::Errno::EINVAL) => {}
        Err(source) => {
            return Err(NetnsError::Sys {
                call: "umount2(MNT_DETACH)",
                path: path.to_owned(),
                source,
            });
        }
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(NetnsError::Io { action: "removing", path: path.to_owned(), source }),
    }
}
