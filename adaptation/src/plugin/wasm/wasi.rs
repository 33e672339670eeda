//! What a WebAssembly plugin may import: `env.log` and WASI preview 1
//! (`wasi_snapshot_preview1`), with nothing of the host but what the
//! sandbox grants (see [`crate::wasm`]).
//!
//! Implemented: arguments (none), environment (the granted variables),
//! clocks, randomness, stdout and stderr (logged), stdin (empty),
//! `poll_oneoff` on clocks (a sleep, cut at the call's deadline),
//! `sched_yield`, `proc_exit`. Every other function of preview 1 (files,
//! directories, sockets) answers `EBADF`: no descriptor beyond 0, 1 and 2
//! exists, none is pre-opened.

use std::time::{Duration, Instant, SystemTime};

use nri_proto::api;
use protobuf::Message;
use wasmtime::{Caller, Extern, ExternType, Linker, Memory, ResourceLimiter, Val, ValType};

use crate::wasm::WasmError;

/// WASI's import module.
pub(super) const WASI: &str = "wasi_snapshot_preview1";

/// Every function of WASI preview 1.
const PREVIEW1: [&str; 46] = [
    "args_get",
    "args_sizes_get",
    "environ_get",
    "environ_sizes_get",
    "clock_res_get",
    "clock_time_get",
    "fd_advise",
    "fd_allocate",
    "fd_close",
    "fd_datasync",
    "fd_fdstat_get",
    "fd_fdstat_set_flags",
    "fd_fdstat_set_rights",
    "fd_filestat_get",
    "fd_filestat_set_size",
    "fd_filestat_set_times",
    "fd_pread",
    "fd_prestat_get",
    "fd_prestat_dir_name",
    "fd_pwrite",
    "fd_read",
    "fd_readdir",
    "fd_renumber",
    "fd_seek",
    "fd_sync",
    "fd_tell",
    "fd_write",
    "path_create_directory",
    "path_filestat_get",
    "path_filestat_set_times",
    "path_link",
    "path_open",
    "path_readlink",
    "path_remove_directory",
    "path_rename",
    "path_symlink",
    "path_unlink_file",
    "poll_oneoff",
    "proc_exit",
    "proc_raise",
    "sched_yield",
    "random_get",
    "sock_accept",
    "sock_recv",
    "sock_send",
    "sock_shutdown",
];

/// Those implemented here; the rest answer [`EBADF`].
const IMPLEMENTED: [&str; 20] = [
    "args_get",
    "args_sizes_get",
    "environ_get",
    "environ_sizes_get",
    "clock_res_get",
    "clock_time_get",
    "fd_close",
    "fd_fdstat_get",
    "fd_fdstat_set_flags",
    "fd_filestat_get",
    "fd_read",
    "fd_seek",
    "fd_tell",
    "fd_write",
    "poll_oneoff",
    "proc_exit",
    "proc_raise",
    "sched_yield",
    "random_get",
    "fd_prestat_get",
];

const SUCCESS: i32 = 0;
const EBADF: i32 = 8;
const EFAULT: i32 = 21;
const EINVAL: i32 = 28;
const ENOSYS: i32 = 52;
const ESPIPE: i32 = 70;
const FILETYPE_CHARACTER_DEVICE: u8 = 2;

/// Bytes of stdout, stderr and `env.log` logged per call; the rest is
/// dropped (counted in one line at the end of the call).
pub(super) const OUTPUT_BUDGET: usize = 64 << 10;
/// stderr lines kept for the error of a trap.
const STDERR_KEPT: usize = 3;
/// Longest line logged; longer ones are cut.
const LINE_MAX: usize = 4096;

/// The plugin's call ended it through `proc_exit`.
#[derive(Debug)]
pub(super) struct Exit(pub i32);

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "proc_exit({})", self.0)
    }
}

impl std::error::Error for Exit {}

/// The memory cap: a growth beyond `limit` bytes fails.
pub(super) struct MemoryCap {
    pub limit: u64,
    /// Set when a growth was refused during the current call.
    pub hit: bool,
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired as u64 > self.limit {
            self.hit = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        // A function table of a million entries is 8 MiB of host memory,
        // far more than any plugin's code needs.
        Ok(desired <= 1 << 20)
    }
}

/// A plugin's side of the host: its name, grants and what it wrote.
pub(super) struct Host {
    /// `IDX-NAME`, for log lines.
    pub plugin: String,
    /// Granted environment, `NAME=VALUE`.
    pub env: Vec<String>,
    pub cap: MemoryCap,
    /// Deadline of the call in progress (sleeps are cut there).
    pub deadline: Option<Instant>,
    /// Base of the monotonic clock.
    started: Instant,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// The last complete stderr lines of the current call (at most
    /// [`STDERR_KEPT`]).
    stderr_tail: std::collections::VecDeque<String>,
    logged: usize,
    dropped: usize,
}

impl Host {
    pub fn new(plugin: String, env: Vec<String>, limit: u64) -> Host {
        Host {
            plugin,
            env,
            cap: MemoryCap { limit, hit: false },
            deadline: None,
            started: Instant::now(),
            stdout: Vec::new(),
            stderr: Vec::new(),
            stderr_tail: std::collections::VecDeque::new(),
            logged: 0,
            dropped: 0,
        }
    }

    /// Resets the per-call state before a call.
    pub fn begin(&mut self, deadline: Instant) {
        self.deadline = Some(deadline);
        self.cap.hit = false;
        self.stderr_tail.clear();
        self.logged = 0;
        self.dropped = 0;
    }

    /// Flushes partial output lines after a call and reports what the
    /// output budget dropped.
    pub fn end(&mut self) {
        self.deadline = None;
        for stream in [1, 2] {
            let pending = std::mem::take(if stream == 1 {
                &mut self.stdout
            } else {
                &mut self.stderr
            });
            if !pending.is_empty() {
                self.line(stream, &pending);
            }
        }
        if self.dropped > 0 {
            tracing::warn!(plugin = %self.plugin, bytes = self.dropped, "WebAssembly plugin wrote more than {OUTPUT_BUDGET} bytes of output and log in one call; the rest was dropped");
        }
    }

    /// Whether `n` more bytes of output fit in this call's budget.
    fn spend(&mut self, n: usize) -> bool {
        if self.logged + n > OUTPUT_BUDGET {
            self.dropped += n;
            return false;
        }
        self.logged += n;
        true
    }

    fn line(&mut self, stream: i32, bytes: &[u8]) {
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(LINE_MAX)]).into_owned();
        if stream == 2 {
            if self.stderr_tail.len() == STDERR_KEPT {
                self.stderr_tail.pop_front();
            }
            self.stderr_tail.push_back(text.chars().take(512).collect());
        }
        if !self.spend(bytes.len()) {
            return;
        }
        if stream == 1 {
            tracing::info!(plugin = %self.plugin, stream = "stdout", "{text}");
        } else {
            tracing::warn!(plugin = %self.plugin, stream = "stderr", "{text}");
        }
    }

    /// The last stderr lines of the current call, joined by ` | ` (a Rust
    /// panic's message and its note), if it wrote any.
    pub fn last_stderr(&self) -> Option<String> {
        if self.stderr_tail.is_empty() {
            return None;
        }
        Some(
            self.stderr_tail
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(" | "),
        )
    }

    /// Output written to fd 1 or 2, logged line by line.
    fn write(&mut self, stream: i32, mut data: &[u8]) {
        while let Some(nl) = data.iter().position(|&b| b == b'\n') {
            let buf = if stream == 1 {
                &mut self.stdout
            } else {
                &mut self.stderr
            };
            buf.extend_from_slice(&data[..nl]);
            let line = std::mem::take(buf);
            self.line(stream, &line);
            data = &data[nl + 1..];
        }
        let buf = if stream == 1 {
            &mut self.stdout
        } else {
            &mut self.stderr
        };
        // A partial line waits for its end, up to the longest line logged.
        let room = LINE_MAX.saturating_sub(buf.len());
        buf.extend_from_slice(&data[..data.len().min(room)]);
    }

    /// An `env.log` request: logged at its level with the plugin's name.
    fn log(&mut self, req: &api::LogRequest) {
        if !self.spend(req.msg.len()) {
            return;
        }
        let msg = &req.msg[..floor_char_boundary(&req.msg, LINE_MAX)];
        use api::log_request::Level;
        match req.level.enum_value() {
            Ok(Level::LEVEL_INFO) => tracing::info!(plugin = %self.plugin, "{msg}"),
            Ok(Level::LEVEL_WARN) => tracing::warn!(plugin = %self.plugin, "{msg}"),
            Ok(Level::LEVEL_ERROR) => tracing::error!(plugin = %self.plugin, "{msg}"),
            _ => tracing::debug!(plugin = %self.plugin, "{msg}"),
        }
    }
}

fn floor_char_boundary(s: &str, max: usize) -> usize {
    if s.len() <= max {
        return s.len();
    }
    (0..=max).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0)
}

/// Checks the module's imports against what is offered: an error names
/// the first one that is not.
pub(super) fn check_imports(module: &wasmtime::Module) -> Result<(), WasmError> {
    for import in module.imports() {
        let (m, n) = (import.module(), import.name());
        let offered = (m == "env" && n == "log") || (m == WASI && PREVIEW1.contains(&n));
        if !offered {
            return Err(WasmError::UnknownImport {
                module: m.to_string(),
                name: n.to_string(),
            });
        }
        if !matches!(import.ty(), ExternType::Func(_)) {
            return Err(WasmError::ImportType {
                module: m.to_string(),
                name: n.to_string(),
                detail: "not a function; the runtime offers functions only".to_string(),
            });
        }
    }
    Ok(())
}

/// The guest's exported memory.
fn memory(caller: &mut Caller<'_, Host>) -> wasmtime::Result<Memory> {
    match caller.get_export("memory") {
        Some(Extern::Memory(m)) => Ok(m),
        _ => Err(wasmtime::Error::msg("the module exports no memory")),
    }
}

/// Reads `len` bytes at `ptr` of the guest's memory.
fn read(caller: &mut Caller<'_, Host>, ptr: i32, len: i32) -> Option<Vec<u8>> {
    let mem = memory(caller).ok()?;
    let (ptr, len) = (ptr as u32 as usize, len as u32 as usize);
    mem.data(&*caller).get(ptr..ptr.checked_add(len)?).map(<[u8]>::to_vec)
}

/// Writes `bytes` at `ptr`; false when out of bounds.
fn write(caller: &mut Caller<'_, Host>, ptr: i32, bytes: &[u8]) -> bool {
    let Ok(mem) = memory(caller) else {
        return false;
    };
    mem.write(&mut *caller, ptr as u32 as usize, bytes).is_ok()
}

fn write_u32(caller: &mut Caller<'_, Host>, ptr: i32, v: u32) -> bool {
    write(caller, ptr, &v.to_le_bytes())
}

fn write_u64(caller: &mut Caller<'_, Host>, ptr: i32, v: u64) -> bool {
    write(caller, ptr, &v.to_le_bytes())
}

fn errno(ok: bool) -> i32 {
    if ok { SUCCESS } else { EFAULT }
}

/// `*_sizes_get`: count and total bytes (with NULs) of `items`.
fn sizes_get(caller: &mut Caller<'_, Host>, items: &[String], count_ptr: i32, size_ptr: i32) -> i32 {
    let size: usize = items.iter().map(|s| s.len() + 1).sum();
    errno(write_u32(caller, count_ptr, items.len() as u32) && write_u32(caller, size_ptr, size as u32))
}

/// `*_get`: the pointers at `ptrs` and NUL-terminated strings at `buf`.
fn strings_get(caller: &mut Caller<'_, Host>, items: &[String], ptrs: i32, buf: i32) -> i32 {
    let mut at = buf as u32;
    for (i, s) in items.iter().enumerate() {
        let mut bytes = s.as_bytes().to_vec();
        bytes.push(0);
        if !write_u32(caller, ptrs.wrapping_add(4 * i as i32), at) || !write(caller, at as i32, &bytes) {
            return EFAULT;
        }
        at = at.wrapping_add(bytes.len() as u32);
    }
    SUCCESS
}

/// The iovecs (`ptr`, `len` pairs) at `iovs`.
fn iovecs(caller: &mut Caller<'_, Host>, iovs: i32, n: i32) -> Option<Vec<(i32, i32)>> {
    let raw = read(caller, iovs, n.checked_mul(8)?)?;
    Some(
        raw.chunks_exact(8)
            .map(|c| {
                let p = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                let l = i32::from_le_bytes([c[4], c[5], c[6], c[7]]);
                (p, l)
            })
            .collect(),
    )
}

fn now_ns(host: &Host, clock: i32) -> Option<u64> {
    match clock {
        0 => SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_nanos() as u64),
        1..=3 => Some(host.started.elapsed().as_nanos() as u64),
        _ => None,
    }
}

/// Defines `env.log` and WASI preview 1 in `linker` for `module`'s
/// imports (checked first with [`check_imports`]).
pub(super) fn define(linker: &mut Linker<Host>, module: &wasmtime::Module) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "log",
        |mut caller: Caller<'_, Host>, ptr: i32, len: i32| -> i64 {
            match read(&mut caller, ptr, len).map(|b| api::LogRequest::parse_from_bytes(&b)) {
                Some(Ok(req)) => caller.data_mut().log(&req),
                _ => tracing::warn!(plugin = %caller.data().plugin, "WebAssembly plugin logged an undecodable message"),
            }
            0
        },
    )?;
    linker.func_wrap(WASI, "args_sizes_get", |mut c: Caller<'_, Host>, n: i32, size: i32| {
        sizes_get(&mut c, &[], n, size)
    })?;
    linker.func_wrap(WASI, "args_get", |_: Caller<'_, Host>, _: i32, _: i32| SUCCESS)?;
    linker.func_wrap(
        WASI,
        "environ_sizes_get",
        |mut c: Caller<'_, Host>, n: i32, size: i32| {
            let env = c.data().env.clone();
            sizes_get(&mut c, &env, n, size)
        },
    )?;
    linker.func_wrap(WASI, "environ_get", |mut c: Caller<'_, Host>, ptrs: i32, buf: i32| {
        let env = c.data().env.clone();
        strings_get(&mut c, &env, ptrs, buf)
    })?;
    linker.func_wrap(
        WASI,
        "clock_res_get",
        |mut c: Caller<'_, Host>, clock: i32, out: i32| {
            if !(0..=3).contains(&clock) {
                return EINVAL;
            }
            errno(write_u64(&mut c, out, 1))
        },
    )?;
    linker.func_wrap(
        WASI,
        "clock_time_get",
        |mut c: Caller<'_, Host>, clock: i32, _precision: i64, out: i32| match now_ns(c.data(), clock) {
            Some(ns) => errno(write_u64(&mut c, out, ns)),
            None => EINVAL,
        },
    )?;
    linker.func_wrap(
        WASI,
        "fd_write",
        |mut c: Caller<'_, Host>, fd: i32, iovs: i32, n: i32, out: i32| {
            if fd != 1 && fd != 2 {
                return EBADF;
            }
            let Some(iovs) = iovecs(&mut c, iovs, n) else {
                return EFAULT;
            };
            let mut total = 0u32;
            for (p, l) in iovs {
                let Some(bytes) = read(&mut c, p, l) else {
                    return EFAULT;
                };
                c.data_mut().write(fd, &bytes);
                total = total.wrapping_add(bytes.len() as u32);
            }
            errno(write_u32(&mut c, out, total))
        },
    )?;
    linker.func_wrap(
        WASI,
        "fd_read",
        |mut c: Caller<'_, Host>, fd: i32, _iovs: i32, _n: i32, out: i32| {
            if fd != 0 {
                return EBADF;
            }
            // stdin is empty.
            errno(write_u32(&mut c, out, 0))
        },
    )?;
    linker.func_wrap(
        WASI,
        "fd_close",
        |_: Caller<'_, Host>, fd: i32| {
            if (0..=2).contains(&fd) { SUCCESS } else { EBADF }
        },
    )?;
    linker.func_wrap(WASI, "fd_fdstat_get", |mut c: Caller<'_, Host>, fd: i32, out: i32| {
        if !(0..=2).contains(&fd) {
            return EBADF;
        }
        // filetype, flags, rights (base: read for stdin, write for the others).
        let mut stat = [0u8; 24];
        stat[0] = FILETYPE_CHARACTER_DEVICE;
        let rights: u64 = if fd == 0 { 1 << 1 } else { 1 << 6 };
        stat[8..16].copy_from_slice(&rights.to_le_bytes());
        errno(write(&mut c, out, &stat))
    })?;
    linker.func_wrap(
        WASI,
        "fd_fdstat_set_flags",
        |_: Caller<'_, Host>, fd: i32, _flags: i32| {
            if (0..=2).contains(&fd) { SUCCESS } else { EBADF }
        },
    )?;
    linker.func_wrap(WASI, "fd_filestat_get", |mut c: Caller<'_, Host>, fd: i32, out: i32| {
        if !(0..=2).contains(&fd) {
            return EBADF;
        }
        let mut stat = [0u8; 64];
        stat[16] = FILETYPE_CHARACTER_DEVICE;
        errno(write(&mut c, out, &stat))
    })?;
    linker.func_wrap(WASI, "fd_prestat_get", |_: Caller<'_, Host>, _fd: i32, _out: i32| EBADF)?;
    linker.func_wrap(
        WASI,
        "fd_seek",
        |_: Caller<'_, Host>, fd: i32, _off: i64, _whence: i32, _out: i32| {
            if (0..=2).contains(&fd) { ESPIPE } else { EBADF }
        },
    )?;
    linker.func_wrap(
        WASI,
        "fd_tell",
        |_: Caller<'_, Host>, fd: i32, _out: i32| {
            if (0..=2).contains(&fd) { ESPIPE } else { EBADF }
        },
    )?;
    linker.func_wrap(WASI, "poll_oneoff", poll_oneoff)?;
    linker.func_wrap(
        WASI,
        "proc_exit",
        |_: Caller<'_, Host>, code: i32| -> wasmtime::Result<()> { Err(wasmtime::Error::new(Exit(code))) },
    )?;
    linker.func_wrap(WASI, "proc_raise", |_: Caller<'_, Host>, _sig: i32| ENOSYS)?;
    linker.func_wrap(WASI, "sched_yield", |_: Caller<'_, Host>| SUCCESS)?;
    linker.func_wrap(WASI, "random_get", |mut c: Caller<'_, Host>, buf: i32, len: i32| {
        let mut bytes = vec![0u8; len as u32 as usize];
        let mut filled = 0;
        while filled < bytes.len() {
            match rustix::rand::getrandom(&mut bytes[filled..], rustix::rand::GetRandomFlags::empty()) {
                Ok(n) => filled += n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return ENOSYS,
            }
        }
        errno(write(&mut c, buf, &bytes))
    })?;
    // The rest of preview 1: no descriptor they could name exists.
    for import in module.imports() {
        if import.module() != WASI || IMPLEMENTED.contains(&import.name()) {
            continue;
        }
        let ExternType::Func(ty) = import.ty() else {
            continue;
        };
        if ty.results().len() != 1 || !matches!(ty.results().next(), Some(ValType::I32)) {
            // Its type is not preview 1's: instantiation names it.
            continue;
        }
        linker.func_new(WASI, import.name(), ty, |_, _, results| {
            results[0] = Val::I32(EBADF);
            Ok(())
        })?;
    }
    Ok(())
}

/// `poll_oneoff`: clock subscriptions sleep (never past the call's
/// deadline) and fire; fd subscriptions fire at once with `EBADF` for
/// descriptors that do not exist, ready for stdin, stdout and stderr.
fn poll_oneoff(mut c: Caller<'_, Host>, subs: i32, events: i32, n: i32, out: i32) -> i32 {
    const SUB: usize = 48;
    const EVENT: usize = 32;
    if n <= 0 {
        return EINVAL;
    }
    let Some(raw) = read(&mut c, subs, n.saturating_mul(SUB as i32)) else {
        return EFAULT;
    };
    let now = c.data().started.elapsed().as_nanos() as u64;
    let mut sleep: Option<u64> = None;
    let mut ready = Vec::new();
    for sub in raw.chunks_exact(SUB) {
        let userdata = u64::from_le_bytes(sub[0..8].try_into().expect("8 bytes"));
        let tag = sub[8];
        let mut event = [0u8; EVENT];
        event[0..8].copy_from_slice(&userdata.to_le_bytes());
        event[10] = tag;
        match tag {
            0 => {
                let timeout = u64::from_le_bytes(sub[24..32].try_into().expect("8 bytes"));
                let flags = u16::from_le_bytes([sub[40], sub[41]]);
                let clock = u32::from_le_bytes(sub[16..20].try_into().expect("4 bytes"));
                let wait = if flags & 1 == 1 {
                    let base = now_ns(c.data(), clock as i32).unwrap_or(now);
                    timeout.saturating_sub(base)
                } else {
                    timeout
                };
                sleep = Some(sleep.map_or(wait, |s| s.min(wait)));
                ready.push((wait, event));
            }
            1 | 2 => {
                let fd = u32::from_le_bytes(sub[16..20].try_into().expect("4 bytes"));
                if fd > 2 {
                    event[8..10].copy_from_slice(&(EBADF as u16).to_le_bytes());
                }
                ready.push((0, event));
            }
            _ => return EINVAL,
        }
    }
    let fd_ready = ready.iter().any(|(w, e)| *w == 0 && e[10] != 0);
    let slept = if fd_ready { 0 } else { sleep.unwrap_or(0) };
    if slept > 0 {
        let mut d = Duration::from_nanos(slept);
        if let Some(deadline) = c.data().deadline {
            d = d.min(deadline.saturating_duration_since(Instant::now()));
        }
        std::thread::sleep(d);
    }
    let fired: Vec<[u8; EVENT]> = ready
        .into_iter()
        .filter(|(w, e)| if e[10] == 0 { *w <= slept } else { true })
        .map(|(_, e)| e)
        .collect();
    for (i, e) in fired.iter().enumerate() {
        if !write(&mut c, events.wrapping_add((i * EVENT) as i32), e) {
            return EFAULT;
        }
    }
    errno(write_u32(&mut c, out, fired.len() as u32))
}
