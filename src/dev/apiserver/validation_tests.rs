//! Table tests of protocols.md §3 limits.
