//! Generates the protobuf messages and ttrpc services of `proto/api.proto`.
//!
//! Generated files land in `$OUT_DIR/nri`; nobody edits them. Both generators
//! emit inner attributes (`#![..]`, `//!`) that `include!` rejects, so those
//! lines are stripped after generation.

use std::{fs, path::PathBuf};

use ttrpc_codegen::{Codegen, Customize, ProtobufCustomize};

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("nri");
    fs::create_dir_all(&out).expect("create OUT_DIR/nri");
    println!("cargo:rerun-if-changed=proto/api.proto");

    Codegen::new()
        .out_dir(&out)
        .include("proto")
        .input("proto/api.proto")
        .rust_protobuf()
        .customize(Customize {
            async_all: true,
            ..Default::default()
        })
        .rust_protobuf_customize(ProtobufCustomize::default().gen_mod_rs(false))
        .run()
        .expect("ttrpc-codegen failed on proto/api.proto");

    for name in ["api.rs", "api_ttrpc.rs"] {
        let path = out.join(name);
        let text = fs::read_to_string(&path).expect("read generated file");
        let kept: Vec<&str> = text
            .lines()
            .filter(|l| {
                let t = l.trim_start();
                !(t.starts_with("#!") || t.starts_with("//!"))
            })
            .collect();
        fs::write(&path, kept.join("\n")).expect("write generated file");
    }
}
