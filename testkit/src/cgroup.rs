//! CPU cgroups for the scale bench, so processes compete for the CPU as they do on a
//! Kubernetes node: kubelet puts the driver's DaemonSet pod in a cgroup of its own under
//! `kubepods`, and systemd runs containerd (with its shims, runc and the CNI plugins it execs)
//! in `containerd.service`. The kernel's fair scheduler shares the CPU between sibling groups
//! by their weight, then between the tasks inside each; in one group instead, a burst's
//! dozens of runc and CNI processes each take a share as large as the daemon's.
//!
//! A [`CpuGroup`] is a child of the root of the `cpu` controller (cgroup v2 when the unified
//! hierarchy has it, else v1's `cpu` mount) with a generated name and the default weight
//! (v2 `cpu.weight` 100, v1 `cpu.shares` 1024). Dropping it moves whatever is left in it back
//! to the root and removes it.

use std::io;
use std::path::{Path, PathBuf};

/// Where the `cpu` controller is mounted, and its weight file there.
fn cpu_root() -> io::Result<(PathBuf, &'static str)> {
    let unified = Path::new("/sys/fs/cgroup");
    let controllers = std::fs::read_to_string(unified.join("cgroup.controllers"));
    if controllers.is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu")) {
        return Ok((unified.to_owned(), "cpu.weight"));
    }
    let v1 = unified.join("cpu");
    if v1.join("cpu.shares").exists() {
        return Ok((v1, "cpu.shares"));
    }
    Err(io::Error::new(io::ErrorKind::NotFound, "no cgroup cpu controller (v2 or v1) is mounted"))
}

/// A child cgroup of the `cpu` controller's root, removed on drop.
#[derive(Debug)]
pub struct CpuGroup {
    path: PathBuf,
    root: PathBuf,
}

impl CpuGroup {
    /// Creates `<root>/<name>` with the default weight. On cgroup v2 the root must already
    /// give its children the `cpu` controller (`cgroup.subtree_control`): the machine's
    /// setting is not ours to change.
    ///
    /// # Errors
    /// No `cpu` controller, or the group could not be made (not root, name taken).
    pub fn create(name: &str) -> io::Result<Self> {
        let (root, weight_file) = cpu_root()?;
        if weight_file == "cpu.weight" {
            let enabled = std::fs::read_to_string(root.join("cgroup.subtree_control"))?;
            if !enabled.split_whitespace().any(|c| c == "cpu") {
                return Err(io::Error::other(
                    "cgroup v2: the root does not enable cpu for its children",
                ));
            }
        }
        let path = root.join(name);
        std::fs::create_dir(&path)?;
        let group = Self { path, root };
        let weight = if weight_file == "cpu.weight" { "100" } else { "1024" };
        std::fs::write(group.path.join(weight_file), weight)?;
        Ok(group)
    }

    /// Moves process `pid` with all its threads into the group; its children made later
    /// start in it.
    ///
    /// # Errors
    /// The process is gone or the kernel refused the move.
    pub fn add(&self, pid: u32) -> io::Result<()> {
        std::fs::write(self.path.join("cgroup.procs"), pid.to_string())
    }

    /// The group's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The processes in the group now.
    pub fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for CpuGroup {
    fn drop(&mut self) {
        // A group with processes cannot be removed: whatever is left (this process, if it
        // moved itself in) goes back to the root first.
        for pid in self.pids() {
            let _ = std::fs::write(self.root.join("cgroup.procs"), pid.to_string());
        }
        if let Err(err) = std::fs::remove_dir(&self.path) {
            eprintln!("cgroup {}: not removed: {err}", self.path.display());
        }
    }
}
