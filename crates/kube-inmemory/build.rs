//! Build script: compiles `proto/kubectl_create.proto` (the Kubernetes types kubectl's
//! typed clients send as protobuf) into an encoded `FileDescriptorSet` in `$OUT_DIR`, which
//! the API server decodes requests with at run time.

use std::env;
use std::path::PathBuf;

fn main() {
    const PROTO: &str = "proto/kubectl_create.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR for build scripts"))
        .join("kubectl_create.bin");
    let mut compiler = protox::Compiler::new(["proto"]).expect("the proto include dir is valid");
    compiler.open_file("kubectl_create.proto").unwrap_or_else(|e| panic!("{PROTO}: {e}"));
    std::fs::write(&out, compiler.encode_file_descriptor_set())
        .unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
}
