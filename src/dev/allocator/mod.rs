//! Allocator standing in for the scheduler's DRA plugin in `netclaim dev` (DESIGN §8):
//! a pure allocation core plus a controller that writes `status.allocation`.

pub mod quantity;
pub mod selector;
