//! Build script: generates Rust code from the project's own `.proto` files under `proto/`
//! (the NRI protos live with the `nri-rs` crate), and compiles the eBPF counters under `bpf/`
//! with clang into `$OUT_DIR` (the daemon embeds the object).
//!
//! Each protocol has its own function so that modules can be merged independently.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    // The CRI client serves only `netclaim dev` (the dev kubelet runs pods through containerd).
    if env::var_os("CARGO_FEATURE_DEV").is_some() {
        cri_protos();
    }
    kubelet_protos();
    bpf_objects();
}

/// `bpf/counters.c` → `$OUT_DIR/counters.bpf.o` (DESIGN §5 item 8). clang's BPF target with
/// `-g`: aya needs the object's BTF for the BTF-style map definition. `NETCLAIM_CLANG` names
/// another clang; `-I/usr/include/<multiarch>` is where Debian keeps `asm/types.h`, which
/// the kernel's uapi headers include.
fn bpf_objects() {
    const SOURCE: &str = "bpf/counters.c";
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-env-changed=NETCLAIM_CLANG");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR for build scripts"))
        .join("counters.bpf.o");
    let clang = env::var("NETCLAIM_CLANG").unwrap_or_else(|_| "clang".to_owned());
    let multiarch = format!(
        "/usr/include/{}-linux-gnu",
        env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".to_owned())
    );
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-Werror"])
        .arg(format!("-I{multiarch}"))
        .args(["-c", SOURCE, "-o"])
        .arg(&out)
        .status();
    match status {
        Ok(status) if status.success() => {}
        Ok(status) => panic!("{clang} failed on {SOURCE} ({status})"),
        Err(err) => panic!(
            "cannot run {clang} to build {SOURCE}: {err}; install clang and libbpf-dev \
             (scripts/setup/00-base.sh) or point NETCLAIM_CLANG at a clang with the BPF target"
        ),
    }
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
