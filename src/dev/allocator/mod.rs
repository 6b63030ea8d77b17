//! Allocator standing in for the scheduler's DRA plugin in `netclaim dev` (DESIGN §8):
//! a pure allocation core plus a controller that writes `status.allocation`.

pub mod allocate;
pub mod controller;
pub mod quantity;
pub mod selector;

pub use controller::{AllocatorController, ControllerError, reserve_for, run, unreserve};

#[cfg(test)]
mod tests;
