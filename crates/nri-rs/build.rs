//! Build script: rust-protobuf messages and ttrpc stubs from the crate's own subset of the NRI
//! API (`proto/api.proto`, package `nri.pkg.api.v1alpha1`).
//!
//! The generated files start with inner attributes, so they cannot be `include!`d into an
//! inline module; `nri_ttrpc_gen.rs` declares them as `#[path]` modules instead.

use std::path::PathBuf;
use std::{env, fs};

fn main() {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo always sets OUT_DIR"));
    let proto = "proto/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let gen_dir = out_dir.join("nri");
    fs::create_dir_all(&gen_dir).expect("OUT_DIR is writable");
    ttrpc_codegen::Codegen::new()
        .out_dir(&gen_dir)
        .inputs([proto])
        .include("proto")
        .rust_protobuf()
        .customize(ttrpc_codegen::Customize { async_all: true, ..Default::default() })
        .run()
        .expect("ttrpc-codegen failed on proto/api.proto");
    let wrapper = format!(
        "#[path = \"{api}\"]\npub mod api;\n#[path = \"{ttrpc}\"]\npub mod api_ttrpc;\n",
        api = gen_dir.join("api.rs").display(),
        ttrpc = gen_dir.join("api_ttrpc.rs").display(),
    );
    fs::write(out_dir.join("nri_ttrpc_gen.rs"), wrapper).expect("OUT_DIR is writable");
}
