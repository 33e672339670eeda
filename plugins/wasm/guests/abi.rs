//! The calling convention of NRI's WebAssembly plugins, guest side, as the
//! runtime expects it (upstream's Go bindings follow the same one):
//!
//! - exports `memory`, `malloc(size i32) -> i32`, `free(ptr i32)`,
//!   `plugin_api_version() -> i64` (1) and one `plugin_<request>(ptr i32,
//!   len i32) -> i64` per request; `_initialize` runs once at load;
//! - a request is the encoded protobuf request message, written by the
//!   runtime into memory it got from `malloc` (and frees after the call);
//! - the answer is `ptr << 32 | len` of the encoded response in memory from
//!   `malloc` (the runtime frees it); 0 is the empty message; bit 31 of
//!   `len` set means the bytes are an error text instead;
//! - imports `env.log(ptr i32, len i32) -> i64` taking an encoded
//!   `LogRequest { msg = 1, level = 2 }`.
//!
//! `malloc` and `free` are wasi-libc's, exported by the linker
//! (`--export=malloc --export=free`): the allocator Rust's own `Vec` uses.
//! `_initialize` is wasi-libc's reactor start (`crt1-reactor.o`, linked in
//! by the build): it runs the C library's and Rust's constructors once.

use crate::pb::Writer;

extern "C" {
    fn malloc(size: usize) -> *mut u8;
}

#[link(wasm_import_module = "env")]
extern "C" {
    #[link_name = "log"]
    fn host_log(ptr: u32, len: u32) -> u64;
}

#[no_mangle]
pub extern "C" fn plugin_api_version() -> u64 {
    1
}

/// Levels of `LogRequest.level`.
#[allow(dead_code)]
pub enum Level {
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
}

/// Logs `msg` through the runtime's `env.log`.
pub fn log(level: Level, msg: &str) {
    let mut req = Writer::new();
    req.string(1, msg).varint(2, level as u64);
    let ptr_len = unsafe { host_log(req.buf.as_ptr() as u32, req.buf.len() as u32) };
    // The answer is an encoded Empty: nothing to read; free what the
    // runtime may have allocated for it.
    let ptr = (ptr_len >> 32) as u32;
    if ptr != 0 {
        unsafe { crate::abi::free_raw(ptr) };
    }
}

extern "C" {
    #[link_name = "free"]
    fn libc_free(ptr: *mut u8);
}

unsafe fn free_raw(ptr: u32) {
    libc_free(ptr as *mut u8)
}

/// Copies `bytes` into memory from `malloc` and packs the answer.
fn pack(bytes: &[u8]) -> u64 {
    if bytes.is_empty() {
        return 0;
    }
    let ptr = unsafe { malloc(bytes.len()) };
    if ptr.is_null() {
        // Out of memory: let the runtime see a trap, not a wrong answer.
        std::process::abort();
    }
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, bytes.len()) };
    (ptr as u64) << 32 | bytes.len() as u64
}

/// The request's bytes.
fn request<'a>(ptr: u32, len: u32) -> &'a [u8] {
    if len == 0 {
        &[]
    } else {
        unsafe { std::slice::from_raw_parts(ptr as *const u8, len as usize) }
    }
}

/// Runs `handle` on one request and packs its answer or error.
pub fn answer(ptr: u32, len: u32, handle: impl FnOnce(&[u8]) -> Result<Vec<u8>, String>) -> u64 {
    match handle(request(ptr, len)) {
        Ok(bytes) => pack(&bytes),
        Err(text) => pack(text.as_bytes()) | 1 << 31,
    }
}

/// The requests, by the name of their export without `plugin_`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Request {
    Configure,
    Synchronize,
    Shutdown,
    RunPodSandbox,
    UpdatePodSandbox,
    PostUpdatePodSandbox,
    StopPodSandbox,
    RemovePodSandbox,
    CreateContainer,
    PostCreateContainer,
    StartContainer,
    PostStartContainer,
    UpdateContainer,
    PostUpdateContainer,
    StopContainer,
    RemoveContainer,
    StateChange,
    ValidateContainerAdjustment,
}

impl Request {
    /// The name of its export without `plugin_`.
    pub fn export(self) -> &'static str {
        match self {
            Request::Configure => "configure",
            Request::Synchronize => "synchronize",
            Request::Shutdown => "shutdown",
            Request::RunPodSandbox => "run_pod_sandbox",
            Request::UpdatePodSandbox => "update_pod_sandbox",
            Request::PostUpdatePodSandbox => "post_update_pod_sandbox",
            Request::StopPodSandbox => "stop_pod_sandbox",
            Request::RemovePodSandbox => "remove_pod_sandbox",
            Request::CreateContainer => "create_container",
            Request::PostCreateContainer => "post_create_container",
            Request::StartContainer => "start_container",
            Request::PostStartContainer => "post_start_container",
            Request::UpdateContainer => "update_container",
            Request::PostUpdateContainer => "post_update_container",
            Request::StopContainer => "stop_container",
            Request::RemoveContainer => "remove_container",
            Request::StateChange => "state_change",
            Request::ValidateContainerAdjustment => "validate_container_adjustment",
        }
    }

    pub fn all() -> [Request; 18] {
        use Request::*;
        [
            Configure,
            Synchronize,
            Shutdown,
            RunPodSandbox,
            UpdatePodSandbox,
            PostUpdatePodSandbox,
            StopPodSandbox,
            RemovePodSandbox,
            CreateContainer,
            PostCreateContainer,
            StartContainer,
            PostStartContainer,
            UpdateContainer,
            PostUpdateContainer,
            StopContainer,
            RemoveContainer,
            StateChange,
            ValidateContainerAdjustment,
        ]
    }
}

/// Defines the 18 `plugin_<request>` exports, each calling
/// `crate::handle(Request, bytes)`.
macro_rules! exports {
    ($($name:ident => $req:ident),* $(,)?) => {
        $(
            #[no_mangle]
            pub extern "C" fn $name(ptr: u32, len: u32) -> u64 {
                answer(ptr, len, |bytes| crate::handle(Request::$req, bytes))
            }
        )*
    };
}

exports! {
    plugin_configure => Configure,
    plugin_synchronize => Synchronize,
    plugin_shutdown => Shutdown,
    plugin_run_pod_sandbox => RunPodSandbox,
    plugin_update_pod_sandbox => UpdatePodSandbox,
    plugin_post_update_pod_sandbox => PostUpdatePodSandbox,
    plugin_stop_pod_sandbox => StopPodSandbox,
    plugin_remove_pod_sandbox => RemovePodSandbox,
    plugin_create_container => CreateContainer,
    plugin_post_create_container => PostCreateContainer,
    plugin_start_container => StartContainer,
    plugin_post_start_container => PostStartContainer,
    plugin_update_container => UpdateContainer,
    plugin_post_update_container => PostUpdateContainer,
    plugin_stop_container => StopContainer,
    plugin_remove_container => RemoveContainer,
    plugin_state_change => StateChange,
    plugin_validate_container_adjustment => ValidateContainerAdjustment,
}
