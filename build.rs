//! Build script: generates Rust code from the project's own `.proto` files under `proto/`.
//!
//! Each protocol has its own function so that modules can be merged independently.

use std::path::{Path, PathBuf};
use std::{env, fs};

fn main() {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo always sets OUT_DIR"));
    nri_protos(&out_dir);
    cri_protos();
    kubelet_protos();
}

/// NRI (`src/nri`): rust-protobuf messages and ttrpc stubs from `proto/nri/api.proto`.
///
/// The generated files start with inner attributes, so they cannot be `include!`d into an
/// inline module; `nri_ttrpc_gen.rs` declares them as `#[path]` modules instead.
fn nri_protos(out_dir: &Path) {
    let proto = "proto/nri/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let gen_dir = out_dir.join("nri");
    fs::create_dir_all(&gen_dir).expect("OUT_DIR is writable");
    ttrpc_codegen::Codegen::new()
        .out_dir(&gen_dir)
        .inputs([proto])
        .include("proto/nri")
        .rust_protobuf()
        .customize(ttrpc_codegen::Customize { async_all: true, ..Default::default() })
        .run()
        .expect("ttrpc-codegen failed on proto/nri/api.proto");
    let wrapper = format!(
        "#[path = \"{api}\"]\npub mod api;\n#[path = \"{ttrpc}\"]\npub mod api_ttrpc;\n",
        api = gen_dir.join("api.rs").display(),
        ttrpc = gen_dir.join("api_ttrpc.rs").display(),
    );
    fs::write(out_dir.join("nri_ttrpc_gen.rs"), wrapper).expect("OUT_DIR is writable");
}

/// CRI (`src/cri`): tonic client from `proto/cri/api.proto`, compiled with protox (no protoc).
fn cri_protos() {
    let proto = "proto/cri/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto/cri"]).expect("proto/cri/api.proto must compile");
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(fds)
        .expect("tonic codegen failed on proto/cri/api.proto");
}

/// Kubelet plugin registration v1, DRA v1 and v1beta1, and DRA health v1alpha1
/// (`src/kubelet/`). Parsed with `protox` (pure Rust) so a fresh machine needs no `protoc`;
/// the generated code lands in `$OUT_DIR/kubelet_protos.rs` as one module tree.
fn kubelet_protos() {
    const PROTOS: [&str; 4] = [
        "proto/pluginregistration/v1/registration.proto",
        "proto/dra/v1/dra.proto",
        "proto/dra/v1beta1/dra.proto",
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
