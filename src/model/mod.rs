//! Domain vocabulary shared by every module: pure data, no I/O.
pub mod network_config;
