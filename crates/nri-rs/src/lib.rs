//! NRI (Node Resource Interface) for Rust: both ends of the protocol containerd and CRI-O use
//! to tell plugins about pod sandboxes and containers.
//!
//! Layers, bottom up:
//! - [`mux`]: one Unix stream carrying two logical connections (8-byte frame header), written
//!   the way Go peers can read it.
//! - `proto` (private): ttrpc services and messages generated from our own subset of the NRI
//!   API (`proto/api.proto`, package `nri.pkg.api.v1alpha1`).
//! - [`plugin`]: the plugin end: registration, event subscription matched to the runtime's NRI
//!   version, per-request deadlines, reconnect with backoff; drives a [`PluginHandler`].
//! - [`runtime`]: the runtime end: accept plugins, configure, synchronize, send events.
//!
//! The crate knows nothing of netclaim; `README.md` shows how to use it on its own.

// Dependencies that nothing imports are caught here (the lint misfires in test crates).
#![cfg_attr(not(test), warn(unused_crate_dependencies))]

pub mod mux;
pub mod plugin;
mod proto;
pub mod runtime;
mod types;

pub use plugin::{
    EventEntry, HandlerError, Plugin, PluginError, PluginHandler, PluginOptions, PluginStatus,
    RuntimeInfo, SessionEnd, call_deadline, event_entry,
};
pub use runtime::{NriRuntime, RegisteredPlugin, RuntimeError, RuntimeOptions, RuntimeProtocol};
pub use types::{Container, Event, EventMask, NriVersion, PodSandbox};

// The README's examples are compiled as doctests, so they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;
