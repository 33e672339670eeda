//! WebAssembly plugins: a file in the plugin directory whose first eight
//! bytes are the WebAssembly magic and version (`\0asm` 1) is loaded as an
//! in-process plugin instead of being executed (NRI v0.9 and later do the
//! same). Needs the crate's `wasm` feature (wasmtime); without it such a
//! file is skipped with a warning.
//!
//! A WebAssembly plugin goes through the same steps as a plugin process:
//! the name of its file is its `IDX-NAME` (no registration), it is
//! configured with its drop-in file from [`Options::plugin_config_path`],
//! synchronized, sent the events it subscribed to in index order, and its
//! answers are checked against its permissions and merged, validated and
//! audited as any plugin's. Its failure policy applies to its failures.
//!
//! # The calling convention
//!
//! The one of upstream's Go bindings (`GOOS=wasip1`, `-buildmode=c-shared`
//! with containerd/nri's `pkg/api`), so such a module loads unmodified:
//!
//! | the module | shape |
//! |---|---|
//! | exports `memory` | its linear memory, where requests and answers are passed |
//! | exports `malloc(size: i32) -> i32`, `free(ptr: i32)` | the runtime allocates each request with `malloc` and frees it after the call; it frees each answer after reading it |
//! | exports `plugin_api_version() -> i64` | must return 1 |
//! | exports `plugin_<request>(ptr: i32, len: i32) -> i64` | one per request, `<request>` in snake case (`configure`, `synchronize`, `shutdown`, `create_container`, `update_container`, `stop_container`, `state_change`, `run_pod_sandbox`, `validate_container_adjustment`, ...); the argument is the encoded protobuf request (`len` 0: the empty message, `ptr` 0) |
//! | returns `ptr << 32 \| len` | the encoded protobuf answer at `ptr`; 0 is the empty message; bit 31 of `len` set means the bytes are the plugin's error text |
//! | may export `_initialize()` | called once after instantiation (a WASI reactor's start, which Go's `c-shared` modules need) |
//! | may import `env.log(ptr: i32, len: i32) -> i64` | an encoded `LogRequest` (`msg` = 1, `level` = 2: 1 debug, 2 info, 3 warn, 4 error, else debug); logged with the plugin's name; returns 0 (the empty `Empty`) |
//! | may import `wasi_snapshot_preview1.*` | WASI preview 1, as the sandbox below allows |
//!
//! Shutdown takes and returns `Empty`, StateChange takes a
//! `StateChangeEvent` and returns `Empty`, every other request takes
//! `<Request>Request` and returns `<Request>Response`. An answer of 0 to
//! Configure (no events) subscribes the plugin to every event.
//!
//! Required exports are those of the oldest bindings (NRI v0.9):
//! `memory`, `malloc`, `free`, `plugin_api_version`, `plugin_configure`,
//! `plugin_synchronize`, `plugin_shutdown`, `plugin_create_container`,
//! `plugin_update_container`, `plugin_stop_container` and
//! `plugin_state_change`. A notification without its own export (NRI
//! before v0.12) is sent to `plugin_state_change`; UpdatePodSandbox and
//! ValidateContainerAdjustment without theirs are left out of the plugin's
//! subscription (upstream requires all twenty exports of v0.12 and refuses
//! older modules).
//!
//! # The sandbox
//!
//! Tighter than upstream's (wazero, where a plugin may grow its memory to
//! 4 GiB and a request that hangs holds the runtime's request until its
//! deadline, then the plugin's module is closed):
//!
//! - **memory**: at most [`WasmOptions::memory_limit`] bytes of linear
//!   memory (default 64 MiB); growing beyond fails the growth, and an
//!   allocator that then gives up traps (reported as out of memory);
//! - **time**: each request runs under the request timeout, Configure and
//!   Synchronize included, and `_initialize` under the registration timeout;
//!   at the deadline the plugin's code is interrupted wherever it is
//!   (epoch interruption), the request counts as timed out and its failure
//!   policy applies; a plugin's code never runs on the runtime's async
//!   threads, so a plugin looping forever holds up only its own requests;
//! - **environment**: none, unless [`WasmGrants::env`] grants variables;
//!   no command-line arguments;
//! - **files and network**: none; no directory is pre-opened (WASI
//!   preview 1 has no way to open a socket); stdin reads as empty; what
//!   the plugin writes to stdout and stderr is logged with its name (at
//!   most 64 KiB per call), the last three stderr lines also end the error
//!   of a trap (a Rust panic's message);
//! - **clocks and randomness**: the host's real-time and monotonic clocks,
//!   randomness from the kernel;
//! - **proc_exit** ends the plugin (reported with its status).
//!
//! A plugin that traps, is interrupted at its deadline or exits cannot go
//! on (its memory may be half-updated): its instance is dropped and the
//! plugin removed like a plugin process whose connection broke, whatever
//! its failure policy (a process that only timed out stays under
//! `fail`, since it may still answer). An answer that cannot be decoded,
//! or lies outside the plugin's memory, removes it too. An error text
//! (bit 31) is the plugin's own verdict and fails the request, as an
//! error status from a plugin process does.
//!
//! Each module is compiled once per content (a cache shared by every
//! adaptation of the process, holding modules while a plugin uses them);
//! each plugin gets its own instance and store, on a thread of its own.
//!
//! [`Options::plugin_config_path`]: crate::Options::plugin_config_path

use std::collections::{BTreeMap, HashMap};

/// Sandbox settings of WebAssembly plugins ([`Options::wasm`]).
///
/// [`Options::wasm`]: crate::Options::wasm
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WasmOptions {
    /// Largest linear memory of a plugin, in bytes (default 64 MiB,
    /// [`DEFAULT_MEMORY_LIMIT`]); a plugin's [`WasmGrants::memory_limit`]
    /// overrides it.
    pub memory_limit: u64,
    /// What single plugins are granted beyond the defaults, keyed by
    /// `NAME` or `IDX-NAME` (the latter wins), as the plugin permissions.
    pub plugins: HashMap<String, WasmGrants>,
}

/// Default [`WasmOptions::memory_limit`]: 64 MiB.
pub const DEFAULT_MEMORY_LIMIT: u64 = 64 << 20;

impl Default for WasmOptions {
    fn default() -> Self {
        WasmOptions {
            memory_limit: DEFAULT_MEMORY_LIMIT,
            plugins: HashMap::new(),
        }
    }
}

/// What one WebAssembly plugin is granted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WasmGrants {
    /// Environment variables the plugin sees (WASI `environ_get`), name to
    /// value; none by default.
    pub env: BTreeMap<String, String>,
    /// Its largest linear memory in bytes, instead of
    /// [`WasmOptions::memory_limit`].
    pub memory_limit: Option<u64>,
}

impl WasmOptions {
    /// The grants of plugin `idx-base`: its `IDX-NAME` entry, else its
    /// `NAME` entry, else none.
    pub fn grants(&self, idx: &str, base: &str) -> Option<&WasmGrants> {
        self.plugins
            .get(&format!("{idx}-{base}"))
            .or_else(|| self.plugins.get(base))
    }

    /// The memory limit of plugin `idx-base`, in bytes.
    pub fn memory_limit(&self, idx: &str, base: &str) -> u64 {
        self.grants(idx, base)
            .and_then(|g| g.memory_limit)
            .unwrap_or(self.memory_limit)
    }
}

/// Why a WebAssembly plugin could not be loaded (the plugin is left out,
/// logged with its file).
#[derive(Debug, thiserror::Error)]
pub enum WasmError {
    /// The file could not be read.
    #[error("cannot read the module: {0}")]
    Read(#[source] std::io::Error),
    /// The engine refused the module (not valid WebAssembly, or uses a
    /// proposal the engine does not enable).
    #[error("not a valid WebAssembly module: {0}")]
    Compile(String),
    /// The module imports a function the runtime does not offer.
    #[error("imports {module}.{name}, which this runtime does not offer (only env.log and wasi_snapshot_preview1)")]
    UnknownImport {
        /// Import module.
        module: String,
        /// Import name.
        name: String,
    },
    /// The module imports something that is not a function, or a
    /// function of another type than the runtime's.
    #[error("import {module}.{name} has the wrong type: {detail}")]
    ImportType {
        /// Import module.
        module: String,
        /// Import name.
        name: String,
        /// What the engine said.
        detail: String,
    },
    /// A required export is missing.
    #[error("does not export {0}, which every NRI WebAssembly plugin must")]
    MissingExport(&'static str),
    /// An export has the wrong kind or type.
    #[error("export {name} has the wrong type: expected {expected}")]
    ExportType {
        /// The export.
        name: String,
        /// Its type in the calling convention.
        expected: &'static str,
    },
    /// `plugin_api_version` returned something else than 1.
    #[error("plugin API version {0}, this runtime speaks version 1")]
    ApiVersion(i64),
    /// Instantiation failed (a memory larger than the limit, a trap in the
    /// start function, ...).
    #[error("cannot instantiate the module: {0}")]
    Instantiate(String),
    /// `_initialize` or `plugin_api_version` failed.
    #[error("{export} failed: {source}")]
    Start {
        /// The export.
        export: &'static str,
        /// How it failed.
        source: WasmCallError,
    },
    /// The worker thread of the plugin could not be started.
    #[error("cannot start the plugin's thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// How a call into a WebAssembly plugin failed, beyond a timeout (a
/// [`PluginError::Timeout`](crate::PluginError::Timeout)) or the plugin's
/// own error text (a [`PluginError::Returned`](crate::PluginError::Returned)).
/// All of these remove the plugin.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WasmCallError {
    /// The plugin's code trapped: a Rust panic or Go runtime fatal error
    /// (`unreachable`), an out-of-bounds access, a stack overflow, ...
    #[error("trapped: {trap}{}", .stderr.as_ref().map(|l| format!(" (its last stderr lines: {l})")).unwrap_or_default())]
    Trap {
        /// The engine's description of the trap.
        trap: String,
        /// The last lines (up to 3) the plugin wrote to stderr in this
        /// call, joined by ` | `, if any.
        stderr: Option<String>,
    },
    /// The plugin trapped after its memory reached its limit.
    #[error("ran out of memory: its limit is {limit} bytes{}", .stderr.as_ref().map(|l| format!(" (its last stderr lines: {l})")).unwrap_or_default())]
    OutOfMemory {
        /// The memory limit in bytes.
        limit: u64,
        /// The last lines (up to 3) the plugin wrote to stderr in this
        /// call, joined by ` | `, if any.
        stderr: Option<String>,
    },
    /// The plugin called WASI `proc_exit`.
    #[error("exited with status {0}")]
    Exited(i32),
    /// The plugin's answer is not what the calling convention allows: it
    /// lies outside its memory, does not decode as the response message,
    /// or `malloc` gave no room for the request.
    #[error("answered garbage: {0}")]
    Garbage(String),
    /// The plugin was already dropped by an earlier failure.
    #[error("its instance was stopped by an earlier failure")]
    Stopped,
}

impl WasmCallError {
    /// Whether the plugin's instance can take no further call.
    pub fn kills_instance(&self) -> bool {
        !matches!(self, WasmCallError::Garbage(_))
    }
}

/// Whether `path` starts with the WebAssembly magic and version 1
/// (`00 61 73 6d 01 00 00 00`), as upstream's `isWasm` checks.
pub fn is_wasm(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == *b"\0asm\x01\0\0\0"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_by_qualified_name_then_name() {
        let mut o = WasmOptions::default();
        assert_eq!(o.memory_limit("10", "a"), 64 << 20);
        o.plugins.insert(
            "a".into(),
            WasmGrants {
                memory_limit: Some(1 << 20),
                ..Default::default()
            },
        );
        assert_eq!(o.memory_limit("10", "a"), 1 << 20);
        o.plugins.insert("10-a".into(), WasmGrants::default());
        assert_eq!(
            o.memory_limit("10", "a"),
            64 << 20,
            "IDX-NAME wins, without a limit of its own"
        );
        assert_eq!(o.memory_limit("20", "a"), 1 << 20);
        assert!(o.grants("10", "b").is_none());
    }

    #[test]
    fn errors_say_what_was_wrong() {
        let e = WasmCallError::Trap {
            trap: "wasm trap: wasm `unreachable` instruction executed".into(),
            stderr: Some("panicked at 'boom'".into()),
        };
        assert_eq!(
            e.to_string(),
            "trapped: wasm trap: wasm `unreachable` instruction executed (its last stderr lines: panicked at 'boom')"
        );
        assert_eq!(
            WasmError::MissingExport("plugin_configure").to_string(),
            "does not export plugin_configure, which every NRI WebAssembly plugin must"
        );
        assert!(!WasmCallError::Garbage("x".into()).kills_instance());
        assert!(WasmCallError::Exited(3).kills_instance());
    }
}
