//! Build script: compiles the project's own `.proto` files into Rust.
//!
//! Each protocol family has its own function so that modules can add theirs independently.

use std::error::Error;

fn main() -> Result<(), Box<dyn Error>> {
    compile_kubelet_protos()?;
    Ok(())
}

/// Kubelet plugin registration v1, DRA v1 and v1beta1, and DRA health v1alpha1
/// (`src/kubelet/`). Parsed with `protox` (pure Rust) so a fresh machine needs no `protoc`;
/// the generated code lands in `$OUT_DIR/kubelet_protos.rs` as one module tree.
fn compile_kubelet_protos() -> Result<(), Box<dyn Error>> {
    const PROTOS: [&str; 4] = [
        "proto/pluginregistration/v1/registration.proto",
        "proto/dra/v1/dra.proto",
        "proto/dra/v1beta1/dra.proto",
        "proto/dra-health/v1alpha1/health.proto",
    ];
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .include_file("kubelet_protos.rs")
        .compile_fds(descriptors)?;
    Ok(())
}
