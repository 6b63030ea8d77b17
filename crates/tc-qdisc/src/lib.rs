//! The options of three Linux queueing disciplines as the kernel reads and writes them
//! (`include/uapi/linux/pkt_sched.h`): [`tbf`] (token bucket), [`htb`] (hierarchical token
//! bucket: the qdisc and one class) and [`fq`] (fair queueing, the qdisc that honours
//! Earliest Departure Time stamps). Each encodes the attributes nested in `TCA_OPTIONS` of an
//! `RTM_NEWQDISC`/`RTM_NEWTCLASS` and decodes what a dump answers, so a caller with any
//! netlink library (one that carries unknown attributes as raw bytes) can set and read them.
//!
//! Rates are bytes per second, as the kernel keeps them (`tc_ratespec.rate`, `*_RATE64`).
//! Times the kernel keeps in "psched ticks" are converted with the kernel's fixed
//! `PSCHED_SHIFT` of 6 (one tick is 64 ns since Linux 3.x: `PSCHED_TICKS2NS(x) = x << 6`,
//! which `/proc/net/psched` reports as its second field, `0x40`).
//!
//! Integers are in host byte order, as netlink carries them.

pub mod fq;
pub mod htb;
pub mod nla;
pub mod rate;
pub mod tbf;

pub use nla::{Nla, NlaError};
pub use rate::RateSpec;

/// Why a dump's options could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The attribute stream itself is malformed.
    #[error(transparent)]
    Nla(#[from] NlaError),
    /// A required attribute is absent.
    #[error("{0} is missing")]
    Missing(&'static str),
    /// An attribute is shorter than its structure.
    #[error("{name} has {len} bytes, fewer than the {want} of its structure")]
    Short {
        /// The attribute.
        name: &'static str,
        /// Its length.
        len: usize,
        /// The structure's size.
        want: usize,
    },
}

/// Reads a native-endian `u32` at `at` of `bytes` (the caller checked the length).
pub(crate) fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_ne_bytes(word)
}

/// Reads a native-endian `u64` at `at` of `bytes` (the caller checked the length).
pub(crate) fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_ne_bytes(word)
}

/// The value of attribute `kind` of `attrs` as a `u32`, when present and long enough.
pub(crate) fn attr_u32(attrs: &[Nla], kind: u16) -> Option<u32> {
    attrs
        .iter()
        .find(|a| a.kind == kind)
        .filter(|a| a.value.len() >= 4)
        .map(|a| u32_at(&a.value, 0))
}

/// The value of attribute `kind` of `attrs` as a `u64`, when present and long enough.
pub(crate) fn attr_u64(attrs: &[Nla], kind: u16) -> Option<u64> {
    attrs
        .iter()
        .find(|a| a.kind == kind)
        .filter(|a| a.value.len() >= 8)
        .map(|a| u64_at(&a.value, 0))
}

/// The structure attribute `kind` (`name` in errors) of at least `want` bytes.
pub(crate) fn attr_struct<'a>(
    attrs: &'a [Nla],
    kind: u16,
    name: &'static str,
    want: usize,
) -> Result<&'a [u8], DecodeError> {
    let attr = attrs.iter().find(|a| a.kind == kind).ok_or(DecodeError::Missing(name))?;
    if attr.value.len() < want {
        return Err(DecodeError::Short { name, len: attr.value.len(), want });
    }
    Ok(&attr.value)
}
