//! Generates the protobuf messages and ttrpc services of `proto/api.proto`.
//!
//! Generated files land in `$OUT_DIR/nri`; nobody edits them by hand. Both
//! generators emit inner attributes (`#![..]`, `//!`) that `include!`
//! rejects, so those lines are stripped after generation; and the calls that
//! size and write packed repeated enum fields are pointed at
//! `src/packed_enum.rs`, because rust-protobuf 3.7.2 sizes a negative value
//! there as 5 bytes while writing 10 (see that file).

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
        let text = if name == "api.rs" {
            packed_enums_fixed(&kept.join("\n"))
        } else {
            kept.join("\n")
        };
        fs::write(&path, text).expect("write generated file");
    }
}

/// Points the generated size and write calls of packed repeated enum fields
/// at `crate::packed_enum`. Fails the build when the generator's calls are
/// not found as expected (a changed generator: look again whether the
/// workaround is still needed), so no field is left with the broken sizing.
fn packed_enums_fixed(text: &str) -> String {
    const SIZE: (&str, &str) = (
        "::protobuf::rt::vec_packed_enum_or_unknown_size(",
        "crate::packed_enum::vec_packed_enum_size(",
    );
    const WRITE: (&str, &str) = (
        "os.write_repeated_packed_enum_or_unknown(",
        "crate::packed_enum::write_packed_enum(os, ",
    );
    let sizes = text.matches(SIZE.0).count();
    let writes = text.matches(WRITE.0).count();
    // LinuxScheduler.flags and LinuxMemoryPolicy.flags.
    assert!(
        sizes == 2 && writes == 2,
        "expected 2 packed enum fields in the generated api.rs, found {sizes} size and {writes} write calls"
    );
    assert!(
        !text.contains("write_repeated_packed_enum_or_unknown_no_tag"),
        "generated api.rs writes packed enums in a way build.rs does not rewrite"
    );
    text.replace(SIZE.0, SIZE.1).replace(WRITE.0, WRITE.1)
}
