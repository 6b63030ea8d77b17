//! Bandwidth ceilings in the counting programs (issue 35, DESIGN §3 `bandwidth`): the rates
//! the daemon writes into an interface's pinned `CEILINGS` map, which the same two
//! classifiers that count read on every packet (egress: Earliest Departure Time stamps for
//! the interface's `fq` qdisc; ingress: a policer), and the record of which netns and
//! interface the programs were attached to, so that a second hook of the same interface keeps
//! them (and its ceilings) instead of replacing them.

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use aya::maps::{Array, Map, MapData};

use super::{BpfError, CounterPins, run_in_netns};
use crate::stats::Ceilings;

/// Map name in `bpf/counters.c`: an array of two `struct ceiling`, slot 0 rx, slot 1 tx.
pub(super) const CEILINGS_MAP: &str = "CEILINGS";
/// Its pin beside the counters.
pub(super) const CEILINGS_PIN: &str = "ceilings";

const SLOT_RX: u32 = 0;
const SLOT_TX: u32 = 1;

/// `struct ceiling` of `bpf/counters.c`, as five u64 (aya reads and writes arrays of u64
/// without unsafe code).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct RawCeiling {
    /// Nanoseconds per byte at the rate, times 2^[`SCALE_SHIFT`]; 0: no ceiling.
    pub scaled_ns_per_byte: u64,
    /// Egress: the pacing horizon; ingress: the policer's burst tolerance (ns).
    pub horizon_ns: u64,
    /// The programs' next free departure time; reset to 0 (now) when the daemon writes.
    pub next: u64,
    /// Inode of the netns the programs were attached in (slot 0 only; 0: attach unfinished).
    pub owner_netns: u64,
    /// Index of the interface they were attached to (slot 0 only).
    pub owner_ifindex: u64,
}

/// The map's value: the fields of `struct ceiling` in order.
type CeilingValue = [u64; 5];

impl From<CeilingValue> for RawCeiling {
    fn from(v: CeilingValue) -> Self {
        Self {
            scaled_ns_per_byte: v[0],
            horizon_ns: v[1],
            next: v[2],
            owner_netns: v[3],
            owner_ifindex: v[4],
        }
    }
}

impl From<RawCeiling> for CeilingValue {
    fn from(c: RawCeiling) -> Self {
        [c.scaled_ns_per_byte, c.horizon_ns, c.next, c.owner_netns, c.owner_ifindex]
    }
}

/// The fixed-point shift of `scaled_ns_per_byte` (`SCALE_SHIFT` in `bpf/counters.c`).
const SCALE_SHIFT: u32 = 20;

/// Egress packets whose departure would be more than this ahead are dropped (and counted):
/// Cilium's EDT default; `fq` itself drops beyond its own horizon (10 s by default). TCP never
/// gets near it (TCP small queues keep a few packets per socket in the qdisc), a UDP flood does.
pub(super) const EGRESS_HORIZON_NS: u64 = 2_000_000_000;

/// The policer lets a burst of this much traffic at the rate through at once: less, and TCP
/// behind it collapses (every window's burst loses packets); more, and the ceiling is loose
/// over short intervals.
pub(super) const POLICE_BURST_NS: u64 = 20_000_000;

/// ...but never less than one 64 KiB packet (GRO merges received segments up to that size
/// before the ingress hook sees them: a smaller bucket would drop every merged packet).
const POLICE_BURST_MIN_BYTES: u64 = 64 * 1024;

/// Nanoseconds per byte at `bps` bits per second, times 2^20: 8e9 / bps scaled.
#[must_use]
pub(super) fn scaled_ns_per_byte(bps: u64) -> u64 {
    let scaled = (8_000_000_000_u128 << SCALE_SHIFT) / u128::from(bps.max(1));
    // 1 bit/s gives 8.4e15: no real rate comes near u64::MAX, but never wrap.
    u64::try_from(scaled).unwrap_or(u64::MAX).max(1)
}

/// The ns one `bytes` take at the scaled rate.
fn ns_for(bytes: u64, scaled: u64) -> u64 {
    u64::try_from((u128::from(bytes) * u128::from(scaled)) >> SCALE_SHIFT).unwrap_or(u64::MAX)
}

/// The two slots the daemon writes for `ceilings`: `[rx, tx]`.
///
/// # Errors
/// [`BpfError::ZeroRate`] for a rate of 0 (a ceiling that lets nothing through is refused
/// at prepare; here it would be a bug).
pub(super) fn slots(ceilings: Ceilings) -> Result<[RawCeiling; 2], BpfError> {
    let rx = match ceilings.ingress_police_bps {
        None => RawCeiling::default(),
        Some(0) => return Err(BpfError::ZeroRate { direction: "ingress" }),
        Some(bps) => {
            let scaled = scaled_ns_per_byte(bps);
            RawCeiling {
                scaled_ns_per_byte: scaled,
                horizon_ns: POLICE_BURST_NS.max(ns_for(POLICE_BURST_MIN_BYTES, scaled)),
                ..RawCeiling::default()
            }
        }
    };
    let tx = match ceilings.egress_bps {
        None => RawCeiling::default(),
        Some(0) => return Err(BpfError::ZeroRate { direction: "egress" }),
        Some(bps) => RawCeiling {
            scaled_ns_per_byte: scaled_ns_per_byte(bps),
            horizon_ns: EGRESS_HORIZON_NS,
            ..RawCeiling::default()
        },
    };
    Ok([rx, tx])
}

/// One hook operation at a time in the process: the stats service hooking an interface and
/// the CreateContainer gate setting its ceilings must not both attach it (the second would
/// replace the first's programs and lose what it wrote). Attaches take milliseconds; they
/// are off the sandbox's path.
static SERIAL: Mutex<()> = Mutex::new(());

pub(super) fn serialise() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The inode of the network namespace file at `netns` (bind mount or `/proc/<pid>/ns/net`):
/// the same namespace has the same inode while it lives.
fn netns_inode(netns: &Path) -> Option<u64> {
    std::fs::metadata(netns).ok().map(|meta| meta.ino())
}

/// Opens the pinned ceilings of `dir`.
fn open(dir: &Path) -> Result<Option<Array<MapData, CeilingValue>>, BpfError> {
    let path = dir.join(CEILINGS_PIN);
    let read_error = |source| BpfError::Read { path: path.clone(), source: Box::new(source) };
    let data = match MapData::from_pin(&path) {
        Ok(data) => data,
        Err(aya::maps::MapError::SyscallError(err))
            if err.io_error.kind() == std::io::ErrorKind::NotFound =>
        {
            return Ok(None);
        }
        Err(err) => return Err(read_error(err)),
    };
    let map = Map::from_map_data(data).map_err(read_error)?;
    Array::try_from(map).map(Some).map_err(read_error)
}

/// Records, in the freshly loaded map, what the programs were attached to (in the netns
/// thread, after both are attached: a record means the attach finished).
pub(super) fn record_owner(
    ebpf: &mut aya::Ebpf,
    netns_inode: u64,
    interface: &str,
) -> Result<(), BpfError> {
    let ifindex = nix::net::if_::if_nametoindex(interface)
        .map_err(|errno| BpfError::Netns { path: interface.into(), source: errno.into() })?;
    let map = ebpf.map_mut(CEILINGS_MAP).ok_or(BpfError::NoMap)?;
    let mut array: Array<&mut MapData, CeilingValue> =
        Array::try_from(map).map_err(|source| BpfError::Write { source: Box::new(source) })?;
    let owner = RawCeiling {
        owner_netns: netns_inode,
        owner_ifindex: u64::from(ifindex),
        ..RawCeiling::default()
    };
    array
        .set(SLOT_RX, CeilingValue::from(owner), 0)
        .map_err(|source| BpfError::Write { source: Box::new(source) })
}

/// Whether this kernel takes the counting programs (the ones that also pace and police): loads
/// the object and passes both classifiers through the verifier, attaching nothing. The node
/// asks once at start; a kernel that refuses them (older than 5.12: no BPF atomics with
/// fetch, which the pacing's compare-and-exchange needs) gets `tbf` ceilings and no policing.
///
/// # Errors
/// [`BpfError::Load`] or [`BpfError::Program`] with the kernel's refusal.
pub fn programs_load() -> Result<(), BpfError> {
    let mut ebpf = super::LOADER
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .load(super::COUNTERS_OBJECT)
        .map_err(|err| BpfError::Load(Box::new(err)))?;
    for program in [super::RX_PROGRAM, super::TX_PROGRAM] {
        let program_error = |source| BpfError::Program { program, source: Box::new(source) };
        let classifier: &mut aya::programs::SchedClassifier = ebpf
            .program_mut(program)
            .ok_or(aya::programs::ProgramError::NotLoaded)
            .and_then(TryInto::try_into)
            .map_err(program_error)?;
        classifier.load().map_err(program_error)?;
    }
    // Dropping `ebpf` unloads them: nothing was pinned or attached.
    Ok(())
}

impl CounterPins {
    /// Whether this node's programs are attached to `interface` in the netns at `netns`
    /// already: the pins exist and record that namespace and the interface's current index
    /// (a pin left from a namespace that is gone, or from an earlier interface of the same
    /// name, does not count).
    pub(super) fn attached_here(
        &self,
        netns: &Path,
        pod_uid: &str,
        interface: &str,
    ) -> Result<bool, BpfError> {
        let Some(array) = open(&self.dir(pod_uid, interface))? else {
            return Ok(false);
        };
        let owner = RawCeiling::from(array.get(&SLOT_RX, 0).map_err(|source| BpfError::Read {
            path: self.dir(pod_uid, interface),
            source: Box::new(source),
        })?);
        if owner.owner_netns == 0 || Some(owner.owner_netns) != netns_inode(netns) {
            return Ok(false);
        }
        let name = interface.to_owned();
        let ifindex = run_in_netns(netns, move || nix::net::if_::if_nametoindex(name.as_str()))?;
        Ok(ifindex.is_ok_and(|index| u64::from(index) == owner.owner_ifindex))
    }

    /// Sets the bandwidth ceilings of `interface` in the netns at `netns` (see
    /// [`crate::stats::PacingPort::set_pacing`]): hooks the programs first unless they are
    /// attached there already, then writes both directions (a direction without a rate
    /// is cleared). Blocking.
    ///
    /// # Errors
    /// A [`BpfError`] naming the step; a failed first hook leaves nothing behind.
    pub fn set_pacing(
        &self,
        netns: &Path,
        pod_uid: &str,
        interface: &str,
        ceilings: Ceilings,
    ) -> Result<(), BpfError> {
        let [rx, tx] = slots(ceilings)?;
        let _serial = serialise();
        let dir = self.dir(pod_uid, interface);
        if ceilings.is_none() && !dir.exists() {
            return Ok(());
        }
        if !self.attached_here(netns, pod_uid, interface)? {
            // A ceiling the CreateContainer gate waits for: at the daemon's own priority.
            self.attach_replacing(netns, pod_uid, interface, super::Priority::Normal)?;
        }
        let mut array = open(&dir)?.ok_or(BpfError::NoMap)?;
        let write_error = |source| BpfError::Write { source: Box::new(source) };
        // Slot 0 also keeps the owner record.
        let owner = RawCeiling::from(array.get(&SLOT_RX, 0).map_err(write_error)?);
        let rx =
            RawCeiling { owner_netns: owner.owner_netns, owner_ifindex: owner.owner_ifindex, ..rx };
        array.set(SLOT_RX, CeilingValue::from(rx), 0).map_err(write_error)?;
        array.set(SLOT_TX, CeilingValue::from(tx), 0).map_err(write_error)?;
        Ok(())
    }

    /// The ceilings written for `interface` (`[rx, tx]`), `None` when it has no pins.
    ///
    /// # Errors
    /// [`BpfError::Read`] when the pin exists but cannot be read.
    pub fn ceilings(&self, pod_uid: &str, interface: &str) -> Result<Option<Ceilings>, BpfError> {
        let dir = self.dir(pod_uid, interface);
        let Some(array) = open(&dir)? else {
            return Ok(None);
        };
        let read_error = |source| BpfError::Read { path: dir.clone(), source: Box::new(source) };
        let rate = |slot: u32| -> Result<Option<u64>, BpfError> {
            let raw = RawCeiling::from(array.get(&slot, 0).map_err(read_error)?);
            Ok((raw.scaled_ns_per_byte != 0).then(|| {
                let bps = (8_000_000_000_u128 << SCALE_SHIFT) / u128::from(raw.scaled_ns_per_byte);
                u64::try_from(bps).unwrap_or(u64::MAX)
            }))
        };
        Ok(Some(Ceilings { ingress_police_bps: rate(SLOT_RX)?, egress_bps: rate(SLOT_TX)? }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scaled_rate_gives_a_frames_time_within_a_nanosecond_or_a_part_in_a_million() {
        // 1500 bytes at 1 Gbit/s: 12 µs; at 50 Mbit/s: 240 µs; at 100 Gbit/s: 120 ns.
        for (bps, expected) in
            [(1_000_000_000, 12_000), (50_000_000, 240_000), (100_000_000_000, 120)]
        {
            let ns = ns_for(1500, scaled_ns_per_byte(bps));
            // The program's shift rounds down: within 1 ns, or a part in a million.
            assert!(ns.abs_diff(expected) <= (expected / 1_000_000).max(1), "{bps}: {ns}");
        }
    }

    #[test]
    fn a_64k_packet_at_one_kbit_does_not_overflow_the_programs_product() {
        // The program multiplies len (u32) by the scaled value in u64.
        let scaled = scaled_ns_per_byte(1000);
        assert!(u64::from(u32::from(u16::MAX)).checked_mul(scaled).is_some());
        assert!(u64::from(512 * 1024_u32).checked_mul(scaled).is_some(), "BIG TCP packets");
    }

    #[test]
    fn police_burst_is_twenty_ms_or_one_64k_packet() {
        let [fast, _] =
            slots(Ceilings { ingress_police_bps: Some(10_000_000_000), egress_bps: None }).unwrap();
        assert_eq!(fast.horizon_ns, POLICE_BURST_NS);
        // 64 KiB at 1 Mbit/s: 524 ms.
        let [slow, tx] =
            slots(Ceilings { ingress_police_bps: Some(1_000_000), egress_bps: None }).unwrap();
        assert!(slow.horizon_ns.abs_diff(524_288_000) < 1000, "{}", slow.horizon_ns);
        assert_eq!(tx, RawCeiling::default(), "no egress ceiling: cleared");
    }

    #[test]
    fn a_zero_rate_is_refused_naming_the_direction() {
        let err = slots(Ceilings { egress_bps: Some(0), ingress_police_bps: None }).unwrap_err();
        assert!(err.to_string().contains("egress"), "{err}");
    }
}
