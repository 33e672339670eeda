//! Link options of the shim binary.

fn main() {
    // Packed relative relocations (DT_RELR; GNU ld >= 2.38, glibc >= 2.36):
    // the dynamic loader reads a few KiB instead of ~800 KiB of RELA entries
    // at every daemon and helper start, and the daemon keeps those pages
    // resident for its whole life.
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
}
