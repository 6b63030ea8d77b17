//! Build script: generates Rust code from the project's own `.proto` files under `proto/`
//! (the NRI protos live with the `nri-rs` crate).
//!
//! Each protocol has its own function so that modules can be merged independently.

use std::env;

fn main() {
    // The CRI client serves only `netclaim dev` (the dev kubelet runs pods through containerd).
    if env::var_os("CARGO_FEATURE_DEV").is_some() {
        cri_protos();
    }
    kubelet_protos();
}

/// CRI (`src/dev/cri.rs`): tonic client from `proto/cri/api.proto`, compiled with protox (no protoc).
fn cri_protos() {
    let proto = "proto/cri/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto/cri"]).expect("proto/cri/api.proto must compile");
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(fds)
        .expect("tonic codegen failed on proto/cri/api.proto");
}

/// Kubelet plugin registration v1, DRA v1 and v1beta1, and DRA health v1 and v1alpha1
/// (`src/kubelet/`). Parsed with `protox` (pure Rust) so a fresh machine needs no `protoc`;
/// the generated code lands in `$OUT_DIR/kubelet_protos.rs` as one module tree.
fn kubelet_protos() {
    const PROTOS: [&str; 5] = [
        "proto/pluginregistration/v1/registration.proto",
        "proto/dra/v1/dra.proto",
        "proto/dra/v1beta1/dra.proto",
        "proto/dra-health/v1/health.proto",
        "proto/dra-health/v1alpha1/health.proto",
    ];
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors =
        protox::compile(PROTOS, ["proto"]).expect("the kubelet protos under proto/ must compile");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .include_file("kubelet_protos.rs")
        .compile_fds(descriptors)
        .expect("tonic codegen failed on the kubelet protos");
}
