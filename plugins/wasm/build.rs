//! Builds the WebAssembly plugins of `guests/` with Debian 12's Rust
//! compiler (packages `rustc`, `libstd-rust-dev-wasm32`, `lld-14`: Rust
//! 1.63 with the wasm32-wasi standard library) and the modules of `wat/`
//! with the `wat` crate, into `OUT_DIR`. The workspace's own toolchain
//! (rustup's) has no wasm32 standard library here, and none can be
//! downloaded. A missing compiler fails the build, saying what to install.

use std::{path::PathBuf, process::Command};

const GUESTS: [&str; 3] = ["adjuster", "sample", "misbehave"];

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let rustc = std::env::var("NRI_WASM_RUSTC").unwrap_or_else(|_| "/usr/bin/rustc".to_string());
    println!("cargo:rerun-if-env-changed=NRI_WASM_RUSTC");
    println!("cargo:rerun-if-changed=guests");
    println!("cargo:rerun-if-changed=wat");
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let target_lib = sysroot.as_ref().map(|s| s.join("lib/rustlib/wasm32-wasi/lib"));
    let Some((sysroot, _)) = sysroot.zip(target_lib.filter(|l| l.is_dir())) else {
        panic!(
            "nri-wasm-plugins needs a Rust compiler with the wasm32-wasi standard library at {rustc} \
             (Debian: apt-get install rustc libstd-rust-dev-wasm32 lld-14; or set NRI_WASM_RUSTC)"
        );
    };
    let reactor = sysroot.join("lib/rustlib/wasm32-wasi/lib/self-contained/crt1-reactor.o");
    for guest in GUESTS {
        let wasm = out.join(format!("{guest}.wasm"));
        let status = Command::new(&rustc)
            .args([
                "--edition",
                "2021",
                "-O",
                "--target",
                "wasm32-wasi",
                "--crate-type",
                "cdylib",
            ])
            // The modules shared by the guests are not all used by each.
            .args(["-A", "dead_code", "-C", "strip=symbols"])
            // wasi-libc's allocator is the calling convention's malloc and
            // free; its reactor start is _initialize.
            .args(["-C", "link-arg=--export=malloc", "-C", "link-arg=--export=free"])
            .arg("-C")
            .arg(format!("link-arg={}", reactor.display()))
            .arg(format!("guests/{guest}.rs"))
            .arg("-o")
            .arg(&wasm)
            .env_remove("RUSTC_WRAPPER")
            .status()
            .unwrap_or_else(|e| panic!("cannot run {rustc}: {e}"));
        assert!(status.success(), "{rustc} failed to build guests/{guest}.rs");
    }
    for entry in std::fs::read_dir("wat").expect("wat/") {
        let path = entry.expect("wat/ entry").path();
        if path.extension().is_some_and(|e| e == "wat") {
            let bytes = wat::parse_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let name = path.file_stem().expect("a file name").to_string_lossy().into_owned();
            std::fs::write(out.join(format!("{name}.wasm")), bytes).expect("write a module");
        }
    }
}
