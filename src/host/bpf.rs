//! eBPF traffic counters on pod interfaces (DESIGN §5 item 8), with aya: loads the object
//! `build.rs` compiles from `bpf/counters.c`, attaches its two classifiers to one interface
//! inside a pod's network namespace, pins what must outlive the daemon under
//! `<bpffs>/netclaim/<node>/<podUID>/<interface>/`, reads the pinned counters, and detaches.
//! The same classifiers enforce the interface's bandwidth ceilings (egress pacing, ingress
//! policing, `bpf/pacing.rs`, issue 35): a ceiling adds no second program to the path.
//!
//! Attachment: tcx links on kernels that have them (6.6+), which die with their last file
//! descriptor, so each link is pinned (a `kill -9` keeps it, and removing the pin detaches it);
//! on older kernels a `clsact` qdisc with two direct-action filters, which the kernel keeps
//! until they are removed or the interface goes. The counters map is pinned in both cases,
//! so a restarted daemon reads the counts the programs kept adding to while it was down.
//!
//! Attaching and detaching `clsact` filters runs on a dedicated OS thread that entered the
//! pod's netns (aya resolves the interface name and talks netlink in the calling thread's
//! namespace); reading and unpinning are file operations on bpffs that need no namespace.

use std::io::ErrorKind;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use aya::maps::{Map, MapData, PerCpuArray};
use aya::programs::links::FdLink;
use aya::programs::tc::{NlOptions, TcAttachOptions};
use aya::programs::{LinkOrder, SchedClassifier, TcAttachType};
use aya::util::KernelVersion;

use crate::model::stats::{CeilingCounters, CeilingQdiscCounters, DirectionCounters};
use crate::podnet::LinkOpError;
use crate::stats::Ceilings;

mod pacing;
mod port;

pub use pacing::programs_load;
pub use port::CounterPortError;

/// The object `build.rs` compiled from `bpf/counters.c`, aligned as aya's ELF parser needs.
static COUNTERS_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/counters.bpf.o"));

/// One loader for the process, without kernel BTF. `aya::Ebpf::load` (and every new
/// `EbpfLoader`) parses `/sys/kernel/btf/vmlinux` for CO-RE relocations, which these
/// programs do not use: done per interface, that parse cost milliseconds and, with 250 pods,
/// took the daemon's peak RSS from ~40 MiB to ~120 MiB. Even once, the parse (5.5 MB of BTF on
/// a 6.18 kernel) costs ~15 MiB of heap for a moment, which set the daemon's peak resident set;
/// so the loader is made where that file cannot be read ([`loader_without_kernel_btf`]).
static LOADER: std::sync::LazyLock<std::sync::Mutex<aya::EbpfLoader<'static>>> =
    std::sync::LazyLock::new(|| std::sync::Mutex::new(loader_without_kernel_btf()));

/// Where aya's `EbpfLoader::new` reads the kernel's BTF (a fixed path in aya), and its directory.
const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";
const KERNEL_BTF_DIR: &str = "/sys/kernel/btf";

/// An `EbpfLoader` with no BTF, made without parsing the kernel's: `EbpfLoader::new` always
/// parses [`KERNEL_BTF`] and offers no way to skip it, so it runs on a thread of its own in a
/// private mount namespace where an empty tmpfs hides `/sys/kernel/btf` (the parse fails at
/// once; aya then loads without BTF relocations, as `btf(None)` asks). `unshare(CLONE_NEWNS)`
/// changes only the calling thread's mounts, for good, which is why the thread exists: it ends
/// with the namespace after the loader is made, and the host's mounts are never touched
/// (everything is made private first, so the tmpfs does not propagate). When any step
/// fails (no `CAP_SYS_ADMIN`), the loader is made the plain way: one parse, dropped at once.
fn loader_without_kernel_btf() -> aya::EbpfLoader<'static> {
    let plain = || {
        let mut loader = aya::EbpfLoader::new();
        loader.btf(None);
        loader
    };
    if !Path::new(KERNEL_BTF).exists() {
        return plain();
    }
    let hidden = std::thread::Builder::new()
        .name("bpf-loader".to_owned())
        .spawn(|| -> Result<aya::EbpfLoader<'static>, nix::Error> {
            use nix::mount::MsFlags;
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
            nix::mount::mount(
                None::<&str>,
                "/",
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&str>,
            )?;
            nix::mount::mount(
                Some("tmpfs"),
                KERNEL_BTF_DIR,
                Some("tmpfs"),
                MsFlags::MS_RDONLY,
                None::<&str>,
            )?;
            let mut loader = aya::EbpfLoader::new();
            loader.btf(None);
            Ok(loader)
        })
        .ok()
        .and_then(|thread| thread.join().ok());
    match hidden {
        Some(Ok(loader)) => loader,
        Some(Err(errno)) => {
            tracing::debug!(
                %errno,
                "no private mount namespace to hide the kernel BTF in; parsing it once"
            );
            plain()
        }
        None => plain(),
    }
}

/// The embedded counters object (for benchmarks that load it themselves).
#[must_use]
pub fn counters_object() -> &'static [u8] {
    COUNTERS_OBJECT
}

/// The values the daemon writes into the object's `CEILINGS` map for `ceilings` (`[rx, tx]`,
/// each `struct ceiling` of `bpf/counters.c` as five u64), for tests and benchmarks that load
/// the object themselves and run its programs with `BPF_PROG_TEST_RUN`.
///
/// # Errors
/// [`BpfError::ZeroRate`] for a rate of 0.
pub fn ceiling_values(ceilings: Ceilings) -> Result<[[u64; 5]; 2], BpfError> {
    pacing::slots(ceilings).map(|[rx, tx]| [rx.into(), tx.into()])
}

/// Program names in `bpf/counters.c`; `clsact` filters are found by them again at detach.
const RX_PROGRAM: &str = "netclaim_rx";
const TX_PROGRAM: &str = "netclaim_tx";
/// Map name in `bpf/counters.c`: a per-CPU array, slot 0 rx (ingress), slot 1 tx (egress).
const COUNTERS_MAP: &str = "COUNTERS";
/// Pin names inside an interface's directory.
const MAP_PIN: &str = "counters";
const RX_LINK_PIN: &str = "rx_link";
const TX_LINK_PIN: &str = "tx_link";

/// `struct counters` of `bpf/counters.c`: bytes, packets, tcp, udp, icmp, other,
/// ceiling_drops, delayed (u64 each).
type RawCounters = [u64; 8];

/// How the classifiers are attached to an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookKind {
    /// tcx links (Linux 6.6+), pinned.
    Tcx,
    /// Direct-action filters on a `clsact` qdisc (any kernel with BPF classifiers).
    Clsact,
}

impl HookKind {
    /// tcx where the running kernel has it, `clsact` otherwise.
    #[must_use]
    pub fn for_running_kernel() -> Self {
        // An unreadable version (no uname release aya can parse) gets the hook every kernel
        // with BPF classifiers has.
        match KernelVersion::current() {
            Ok(version) if version >= KernelVersion::new(6, 6, 0) => Self::Tcx,
            _ => Self::Clsact,
        }
    }

    /// `tcx` or `clsact`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcx => "tcx",
            Self::Clsact => "clsact",
        }
    }
}

/// Why a counter operation failed; each names the interface or path.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    /// A pin directory could not be made, listed or removed.
    #[error("{action} {path}")]
    PinDir {
        /// What was being done.
        action: &'static str,
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The embedded object could not be loaded (ELF, BTF or map creation).
    #[error("loading the counters object")]
    Load(#[source] Box<aya::EbpfError>),
    /// A program is missing from the object, or the verifier refused it.
    #[error("program {program}")]
    Program {
        /// Its name.
        program: &'static str,
        /// aya's error.
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// The map is missing from the object.
    #[error("the counters object has no map {COUNTERS_MAP}")]
    NoMap,
    /// Pinning a map or link failed.
    #[error("pinning {path}")]
    Pin {
        /// The pin path.
        path: PathBuf,
        /// aya's error.
        #[source]
        source: Box<aya::pin::PinError>,
    },
    /// Attaching a classifier failed.
    #[error("attaching {program} ({kind}) to {interface}")]
    Attach {
        /// The program.
        program: &'static str,
        /// `tcx` or `clsact`.
        kind: &'static str,
        /// The interface in the pod.
        interface: String,
        /// aya's error.
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// A tcx attachment did not give a link that can be pinned.
    #[error("the tcx link of {program}")]
    Link {
        /// The program.
        program: &'static str,
        /// aya's error.
        #[source]
        source: Box<aya::programs::links::LinkError>,
    },
    /// Adding the `clsact` qdisc failed.
    #[error("adding a clsact qdisc to {interface}")]
    Clsact {
        /// The interface.
        interface: String,
        /// aya's error.
        #[source]
        source: Box<aya::programs::tc::TcError>,
    },
    /// Removing our `clsact` filters failed.
    #[error("removing filter {program} from {interface}")]
    Detach {
        /// The program name of the filter.
        program: &'static str,
        /// The interface.
        interface: String,
        /// aya's error.
        #[source]
        source: Box<aya::programs::tc::TcError>,
    },
    /// The pinned counters map could not be opened or read.
    #[error("reading {path}")]
    Read {
        /// The pin.
        path: PathBuf,
        /// aya's error.
        #[source]
        source: Box<aya::maps::MapError>,
    },
    /// The pod's netns file could not be opened (or is not a network namespace).
    #[error("opening the pod netns")]
    OpenNetns(#[source] LinkOpError),
    /// The pod's netns could not be entered.
    #[error("entering the pod netns {path}")]
    Netns {
        /// The namespace file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The thread that entered the pod netns died.
    #[error("the netns thread for {0} died")]
    Thread(PathBuf),
    /// A bandwidth ceiling of 0 bits per second.
    #[error("a {direction} ceiling of 0 bit/s")]
    ZeroRate {
        /// `egress` or `ingress`.
        direction: &'static str,
    },
    /// Writing the ceilings map failed.
    #[error("writing the bandwidth ceilings")]
    Write {
        /// aya's error.
        #[source]
        source: Box<aya::maps::MapError>,
    },
}

/// One interface's counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InterfaceCounters {
    /// Received by the pod (the interface's ingress).
    pub rx: DirectionCounters,
    /// Sent by the pod (egress).
    pub tx: DirectionCounters,
    /// What the bandwidth ceiling did.
    pub ceiling: CeilingCounters,
}

/// Sums the per-CPU copies of one slot, field by field.
fn sum(per_cpu: impl IntoIterator<Item = RawCounters>) -> RawCounters {
    per_cpu.into_iter().fold([0; 8], |mut acc, raw| {
        for (total, part) in acc.iter_mut().zip(raw) {
            *total = total.wrapping_add(part);
        }
        acc
    })
}

/// The traffic counters of one slot.
fn direction(raw: &RawCounters) -> DirectionCounters {
    DirectionCounters {
        bytes: raw[0],
        packets: raw[1],
        tcp: raw[2],
        udp: raw[3],
        icmp: raw[4],
        other: raw[5],
    }
}

/// The rx and tx slots, summed over CPUs, as counters.
fn interface_counters(rx: &RawCounters, tx: &RawCounters) -> InterfaceCounters {
    InterfaceCounters {
        rx: direction(rx),
        tx: direction(tx),
        ceiling: CeilingCounters {
            tx_delayed: tx[7],
            tx_dropped: tx[6],
            rx_dropped: rx[6],
            // Read from the qdisc by the port, beside the link's drops.
            qdisc: CeilingQdiscCounters::default(),
        },
    }
}

/// This node's subtree of bpffs: `<bpffs>/netclaim/<node>`. Other nodes' subtrees (test
/// daemons share one bpffs) are never touched.
#[derive(Debug, Clone)]
pub struct CounterPins {
    root: PathBuf,
    kind: HookKind,
}

impl CounterPins {
    /// The subtree of `node` under the bpffs mounted at `bpffs`, attaching with `kind`.
    #[must_use]
    pub fn new(bpffs: &Path, node: &str, kind: HookKind) -> Self {
        Self { root: bpffs.join("netclaim").join(node), kind }
    }

    /// How this node attaches.
    #[must_use]
    pub fn kind(&self) -> HookKind {
        self.kind
    }

    /// The pin directory of one interface.
    #[must_use]
    pub fn dir(&self, pod_uid: &str, interface: &str) -> PathBuf {
        self.root.join(pod_uid).join(interface)
    }

    /// Attaches counters to `interface` inside the netns at `netns`. Programs this node
    /// attached to that very interface already (its ceilings were set first, at the
    /// CreateContainer gate) are kept, counts and ceilings with them; any others of the same
    /// pod interface (left from a netns that is gone, or an earlier interface of that name)
    /// are replaced, the counts starting again from zero. Blocking: a thread enters the
    /// netns for the `clsact` netlink calls and for aya's name lookup. That thread runs at
    /// [`BACKGROUND_NICE`]: counting is off every pod's path, and loading the programs (the
    /// verifier) is the most CPU a pod costs the daemon, so under a burst of sandboxes it
    /// yields to the attaches (issue 36).
    ///
    /// # Errors
    /// A [`BpfError`] naming the step; what this call attached or pinned is removed again.
    pub fn attach(&self, netns: &Path, pod_uid: &str, interface: &str) -> Result<(), BpfError> {
        let _serial = pacing::serialise();
        if self.attached_here(netns, pod_uid, interface)? {
            return Ok(());
        }
        self.attach_replacing(netns, pod_uid, interface, Priority::Background)
    }

    /// [`Self::attach`] without the check, the caller holding the lock.
    fn attach_replacing(
        &self,
        netns: &Path,
        pod_uid: &str,
        interface: &str,
        priority: Priority,
    ) -> Result<(), BpfError> {
        self.detach_unlocked(Some(netns), pod_uid, interface)?;
        let dir = self.dir(pod_uid, interface);
        create_dir(&dir)?;
        let kind = self.kind;
        let netns_inode = std::fs::metadata(netns)
            .map(|meta| std::os::unix::fs::MetadataExt::ino(&meta))
            .map_err(|source| BpfError::Netns { path: netns.to_owned(), source })?;
        let (netns_owned, dir_owned, interface_owned) =
            (netns.to_owned(), dir.clone(), interface.to_owned());
        let attached = run_in_netns_at(netns, priority, move || {
            attach_in_netns(kind, &dir_owned, &interface_owned, netns_inode)
        })
        .and_then(|result| result);
        if attached.is_err() {
            // Best effort: the caller reports the first error, which says what failed.
            let _ignored = self.detach_unlocked(Some(&netns_owned), pod_uid, interface);
        }
        attached
    }

    /// Reads the counters pinned for one interface; `None` when none are pinned.
    ///
    /// # Errors
    /// [`BpfError::Read`] when the pin exists but cannot be read.
    pub fn read_counters(
        &self,
        pod_uid: &str,
        interface: &str,
    ) -> Result<Option<InterfaceCounters>, BpfError> {
        let path = self.dir(pod_uid, interface).join(MAP_PIN);
        let read_error = |source| BpfError::Read { path: path.clone(), source: Box::new(source) };
        let data = match MapData::from_pin(&path) {
            Ok(data) => data,
            Err(aya::maps::MapError::SyscallError(err))
                if err.io_error.kind() == ErrorKind::NotFound =>
            {
                return Ok(None);
            }
            Err(err) => return Err(read_error(err)),
        };
        let map = Map::from_map_data(data).map_err(read_error)?;
        let array: PerCpuArray<MapData, RawCounters> =
            PerCpuArray::try_from(map).map_err(read_error)?;
        let slot = |index: u32| -> Result<RawCounters, BpfError> {
            let values = array.get(&index, 0).map_err(read_error)?;
            Ok(sum(values.iter().copied()))
        };
        Ok(Some(interface_counters(&slot(0)?, &slot(1)?)))
    }

    /// Detaches and unpins one interface's counters. tcx links detach when their pin goes
    /// (the daemon holds no other descriptor); `clsact` filters are removed inside `netns`
    /// when it is given and still exists (a gone netns took them with it). Idempotent.
    ///
    /// # Errors
    /// [`BpfError`] when a filter or a pin could not be removed.
    pub fn detach(
        &self,
        netns: Option<&Path>,
        pod_uid: &str,
        interface: &str,
    ) -> Result<(), BpfError> {
        let _serial = pacing::serialise();
        self.detach_unlocked(netns, pod_uid, interface)
    }

    /// [`Self::detach`], the caller holding the lock.
    fn detach_unlocked(
        &self,
        netns: Option<&Path>,
        pod_uid: &str,
        interface: &str,
    ) -> Result<(), BpfError> {
        let dir = self.dir(pod_uid, interface);
        if !dir.exists() {
            return Ok(());
        }
        let tcx = dir.join(RX_LINK_PIN).exists() || dir.join(TX_LINK_PIN).exists();
        if !tcx && let Some(netns) = netns.filter(|path| path.exists()) {
            let owned = interface.to_owned();
            match run_in_netns(netns, move || remove_filters(&owned)) {
                Ok(result) => result?,
                // The netns went between the check and the open: the filters went with it.
                Err(BpfError::OpenNetns(LinkOpError::NetnsGone { .. })) => {}
                Err(err) => return Err(err),
            }
        }
        remove_dir(&dir)?;
        // The pod's directory goes with its last interface.
        if let Some(pod_dir) = dir.parent() {
            let _ignored = std::fs::remove_dir(pod_dir);
        }
        Ok(())
    }

    /// Pod UIDs with counters pinned under this node's subtree.
    ///
    /// # Errors
    /// [`BpfError::PinDir`] when the subtree cannot be listed.
    pub fn pods(&self) -> Result<Vec<String>, BpfError> {
        list_dir(&self.root)
    }

    /// Interfaces of `pod_uid` with counters pinned.
    ///
    /// # Errors
    /// [`BpfError::PinDir`] when the directory cannot be listed.
    pub fn interfaces(&self, pod_uid: &str) -> Result<Vec<String>, BpfError> {
        list_dir(&self.root.join(pod_uid))
    }
}

fn list_dir(dir: &Path) -> Result<Vec<String>, BpfError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(BpfError::PinDir { action: "listing", path: dir.to_owned(), source });
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| BpfError::PinDir {
            action: "listing",
            path: dir.to_owned(),
            source,
        })?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

fn create_dir(dir: &Path) -> Result<(), BpfError> {
    std::fs::create_dir_all(dir).map_err(|source| BpfError::PinDir {
        action: "creating",
        path: dir.to_owned(),
        source,
    })
}

/// Removes the pins inside `dir` (bpffs holds only pins and directories), then `dir`.
fn remove_dir(dir: &Path) -> Result<(), BpfError> {
    for name in list_dir(dir)? {
        let path = dir.join(&name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(err) if err.kind() == ErrorKind::NotFound => {}
            Err(source) => return Err(BpfError::PinDir { action: "unpinning", path, source }),
        }
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == ErrorKind::NotFound => Ok(()),
        Err(source) => Err(BpfError::PinDir { action: "removing", path: dir.to_owned(), source }),
    }
}

/// Loads the object, attaches both classifiers to `interface` of the calling thread's netns
/// and pins the maps (and the tcx links) in `dir`; then records the owner in the ceilings.
fn attach_in_netns(
    kind: HookKind,
    dir: &Path,
    interface: &str,
    netns_inode: u64,
) -> Result<(), BpfError> {
    let mut ebpf = LOADER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .load(COUNTERS_OBJECT)
        .map_err(|err| BpfError::Load(Box::new(err)))?;
    let map_path = dir.join(MAP_PIN);
    ebpf.map(COUNTERS_MAP)
        .ok_or(BpfError::NoMap)?
        .pin(&map_path)
        .map_err(|source| BpfError::Pin { path: map_path.clone(), source: Box::new(source) })?;
    let ceilings_path = dir.join(pacing::CEILINGS_PIN);
    ebpf.map(pacing::CEILINGS_MAP).ok_or(BpfError::NoMap)?.pin(&ceilings_path).map_err(
        |source| BpfError::Pin { path: ceilings_path.clone(), source: Box::new(source) },
    )?;
    if kind == HookKind::Clsact {
        match aya::programs::tc::qdisc_add_clsact(interface) {
            Ok(()) => {}
            // EEXIST: the interface has a clsact qdisc already (ours from an earlier attach,
            // or another tool's); filters are added beside the others.
            Err(aya::programs::tc::TcError::NetlinkError(err))
                if err.raw_os_error() == Some(nix::libc::EEXIST) => {}
            Err(source) => {
                return Err(BpfError::Clsact {
                    interface: interface.to_owned(),
                    source: Box::new(source),
                });
            }
        }
    }
    for (program, attach_type, pin) in [
        (RX_PROGRAM, TcAttachType::Ingress, RX_LINK_PIN),
        (TX_PROGRAM, TcAttachType::Egress, TX_LINK_PIN),
    ] {
        let program_error = |source| BpfError::Program { program, source: Box::new(source) };
        let classifier: &mut SchedClassifier = ebpf
            .program_mut(program)
            .ok_or(aya::programs::ProgramError::NotLoaded)
            .and_then(TryInto::try_into)
            .map_err(program_error)?;
        classifier.load().map_err(program_error)?;
        let options = match kind {
            HookKind::Tcx => TcAttachOptions::TcxOrder(LinkOrder::default()),
            HookKind::Clsact => TcAttachOptions::Netlink(NlOptions::default()),
        };
        let attach_error = |source| BpfError::Attach {
            program,
            kind: kind.as_str(),
            interface: interface.to_owned(),
            source: Box::new(source),
        };
        let link_id = classifier
            .attach_with_options(interface, attach_type, options)
            .map_err(attach_error)?;
        if kind == HookKind::Tcx {
            let link = classifier.take_link(link_id).map_err(attach_error)?;
            let path = dir.join(pin);
            let fd_link: FdLink = link
                .try_into()
                .map_err(|source| BpfError::Link { program, source: Box::new(source) })?;
            // The pin holds the link: dropping `fd_link` afterwards closes only our descriptor.
            fd_link
                .pin(&path)
                .map_err(|source| BpfError::Pin { path, source: Box::new(source) })?;
        } else {
            // A netlink filter stays in the kernel when aya's handle is dropped: forget the
            // link so dropping the program does not remove it.
            let link = classifier.take_link(link_id).map_err(attach_error)?;
            std::mem::forget(link);
        }
    }
    pacing::record_owner(&mut ebpf, netns_inode, interface)
}

/// Removes our two `clsact` filters from `interface` of the calling thread's netns.
fn remove_filters(interface: &str) -> Result<(), BpfError> {
    for (program, attach_type) in
        [(RX_PROGRAM, TcAttachType::Ingress), (TX_PROGRAM, TcAttachType::Egress)]
    {
        match aya::programs::tc::qdisc_detach_program(interface, attach_type, program) {
            Ok(()) => {}
            // No such filter, or no such interface (it left the netns or was deleted).
            Err(aya::programs::tc::TcError::IoError(err))
                if matches!(err.kind(), ErrorKind::NotFound)
                    || err.raw_os_error() == Some(nix::libc::ENODEV) => {}
            Err(aya::programs::tc::TcError::NetlinkError(err))
                if matches!(
                    err.raw_os_error(),
                    Some(nix::libc::ENOENT | nix::libc::EINVAL | nix::libc::ENODEV)
                ) => {}
            Err(source) => {
                return Err(BpfError::Detach {
                    program,
                    interface: interface.to_owned(),
                    source: Box::new(source),
                });
            }
        }
    }
    Ok(())
}

/// Runs `job` on a new OS thread inside the netns at `path` (the thread ends with the job).
fn run_in_netns<T: Send + 'static>(
    path: &Path,
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BpfError> {
    run_in_netns_at(path, Priority::Normal, job)
}

/// The CPU priority of a netns job's thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Priority {
    /// The daemon's own (a ceiling a container waits for at the CreateContainer gate).
    Normal,
    /// [`BACKGROUND_NICE`]: work no pod waits for.
    Background,
}

/// The nice value of background jobs' threads: the kernel's fair scheduler weighs a thread
/// at nice 10 about a tenth of one at 0, so a runnable attach gets the CPU first, while the
/// job still runs on an idle CPU at full speed. Raising nice needs no privilege.
pub const BACKGROUND_NICE: i32 = 10;

/// [`run_in_netns`] at `priority`. Linux keeps the nice value per thread, and this thread
/// ends with the job, so nothing else ever runs at its priority.
pub(super) fn run_in_netns_at<T: Send + 'static>(
    path: &Path,
    priority: Priority,
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BpfError> {
    let netns = super::netns_file::open_netns_file(path).map_err(BpfError::OpenNetns)?;
    let owned = path.to_owned();
    std::thread::Builder::new()
        .name("netns-bpf".to_owned())
        .spawn(move || -> Result<T, BpfError> {
            if priority == Priority::Background
                && let Err(err) = rustix::process::setpriority_process(None, BACKGROUND_NICE)
            {
                // Only slower to yield; the job itself is unaffected.
                tracing::debug!(%err, "lowering a background netns job's priority");
            }
            nix::sched::setns(netns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|errno| BpfError::Netns { path: owned, source: errno.into() })?;
            Ok(job())
        })
        .map_err(|source| BpfError::Netns { path: path.to_owned(), source })?
        .join()
        .map_err(|_| BpfError::Thread(path.to_owned()))?
}

/// Whether a BPF file system is mounted at `path` (the DaemonSet mounts the host's, which
/// systemd mounts at boot; a plain directory there would make every pin fail).
#[must_use]
pub fn is_bpffs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::BPF_FS_MAGIC)
}

/// Mounts a BPF file system of its own at `dir` (created as needed): each bpffs mount is a
/// separate instance, so the dev cluster's pins never meet the host's `/sys/fs/bpf`.
///
/// # Errors
/// [`BpfError::PinDir`] when the directory cannot be made or the mount fails (not root).
pub fn mount_private_bpffs(dir: &Path) -> Result<(), BpfError> {
    create_dir(dir)?;
    nix::mount::mount(Some("bpf"), dir, Some("bpf"), nix::mount::MsFlags::empty(), None::<&str>)
        .map_err(|errno| BpfError::PinDir {
            action: "mounting bpffs on",
            path: dir.to_owned(),
            source: errno.into(),
        })
}

/// Unmounts a bpffs [`mount_private_bpffs`] made (lazily: a reader still holding a pin
/// does not keep the mount busy) and removes its directory.
pub fn unmount_private_bpffs(dir: &Path) {
    let _ignored = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
    let _ignored = std::fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_cpu_copies_are_summed_field_by_field() {
        let total = sum([
            [100, 2, 1, 0, 1, 0, 0, 0],
            [1500, 1, 1, 0, 0, 0, 1, 3],
            [60, 1, 0, 0, 0, 1, 0, 1],
        ]);
        assert_eq!(
            direction(&total),
            DirectionCounters { bytes: 1660, packets: 4, tcp: 2, udp: 0, icmp: 1, other: 1 }
        );
        assert_eq!(total[6..], [1, 4]);
    }

    #[test]
    fn ceiling_counts_come_from_the_last_two_fields_of_each_slot() {
        let counters = interface_counters(&[0, 0, 0, 0, 0, 0, 7, 99], &[0, 0, 0, 0, 0, 0, 2, 40]);
        // The rx slot's `delayed` is never written (ingress is policed, not paced).
        assert_eq!(
            counters.ceiling,
            CeilingCounters { tx_delayed: 40, tx_dropped: 2, rx_dropped: 7, ..Default::default() }
        );
    }

    /// The job's own thread runs at the background nice value and the caller's is unchanged
    /// (Linux keeps nice per thread). Making and entering a namespace needs root.
    #[test]
    fn a_background_netns_job_runs_at_nice_10_and_leaves_the_caller_alone() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("skipped: making a netns needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let netns = crate::host::netns::create(dir.path(), "nice").unwrap();
        let caller = rustix::process::getpriority_process(None).unwrap();
        let nice = |priority| {
            run_in_netns_at(&netns, priority, || {
                rustix::process::getpriority_process(None).unwrap()
            })
            .unwrap()
        };
        let (background, normal) = (nice(Priority::Background), nice(Priority::Normal));
        crate::host::netns::remove(&netns).unwrap();
        assert_eq!(background, BACKGROUND_NICE);
        assert_eq!(normal, caller);
        assert_eq!(rustix::process::getpriority_process(None).unwrap(), caller);
    }

    #[test]
    fn pins_live_under_the_nodes_subtree() {
        let pins = CounterPins::new(Path::new("/sys/fs/bpf"), "node-a", HookKind::Tcx);
        assert_eq!(
            pins.dir("6f1c", "net1"),
            PathBuf::from("/sys/fs/bpf/netclaim/node-a/6f1c/net1")
        );
    }
}
