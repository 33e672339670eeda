//! The WebAssembly NRI plugins of this repository, built by the build
//! script (see `build.rs`: Debian's rustc with the wasm32-wasi standard
//! library for the Rust guests of `guests/`, the `wat` crate for `wat/`),
//! for the tests, `nri-replay`'s scenarios and the benchmarks.
//!
//! | module | what |
//! |---|---|
//! | [`ADJUSTER`] | `guests/adjuster.rs`: adjusts env, mounts, annotations, memory and CPU of the containers its configuration names; a validator too |
//! | [`SAMPLE`] | `guests/sample.rs`: what upstream's `wasm` sample does (logs every request, answers empty, subscribes to everything) |
//! | [`MISBEHAVE`] | `guests/misbehave.rs`: loops, allocates, panics, answers garbage or exits where its configuration says |
//! | [`NO_EXPORTS`] | `wat/no-exports.wat`: a valid module that is no plugin |
//!
//! Every guest follows the calling convention of `nri_adaptation::wasm`.

use std::path::{Path, PathBuf};

/// Path of the adjuster module.
pub const ADJUSTER: &str = concat!(env!("OUT_DIR"), "/adjuster.wasm");
/// Path of the stand-in of upstream's sample.
pub const SAMPLE: &str = concat!(env!("OUT_DIR"), "/sample.wasm");
/// Path of the misbehaving module.
pub const MISBEHAVE: &str = concat!(env!("OUT_DIR"), "/misbehave.wasm");
/// Path of a module without the plugin exports.
pub const NO_EXPORTS: &str = concat!(env!("OUT_DIR"), "/no-exports.wasm");

/// Copies `module` into `plugin_dir` as `file` (`IDX-NAME`), executable as
/// the plugin directory's rules want; the installed path.
///
/// # Errors
/// The copy's or chmod's error.
pub fn install(module: &str, plugin_dir: &Path, file: &str) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let to = plugin_dir.join(file);
    std::fs::copy(module, &to)?;
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755))?;
    Ok(to)
}
