//! The `netclaim` binary.

fn main() {}
