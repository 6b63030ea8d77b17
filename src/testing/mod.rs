//! Test doubles of the driver's ports, written once for the crate's unit tests and for
//! netclaim-testkit (which re-exports this module): a `DeviceFacts` builder ([`facts`]), a
//! fixed device inventory ([`devices::FixedDevices`]), claims read from a map
//! ([`claims::MapClaims`]) and in-memory leases ([`leases::MemoryLeases`]). The fake kernel and
//! the failure injection are `podnet::{fake, failing}`.
//!
//! Compiled only for the unit tests and with the `testkit` feature: a release build has none
//! of it. None of it is a core module: the core's `#[cfg(test)]` code may use it.

/// The driver's version, for the kit's names of what `make image` builds.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub mod claims;
pub mod devices;
pub mod ethtool;
pub mod facts;
pub mod leases;
pub mod sim_store;
