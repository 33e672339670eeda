//! One WebAssembly plugin's instance and the calling convention (see
//! [`crate::wasm`]): the process-wide engine, the module cache, the epoch
//! ticker that bounds each call, and [`Guest::call`].

use std::{
    collections::HashMap,
    sync::{Arc, Condvar, Mutex, OnceLock},
    time::{Duration, Instant},
};

use nri_proto::sync::lock;
use sha2::{Digest, Sha256};
use wasmtime::{Engine, Instance, Linker, Memory, Module, Store, Trap, TypedFunc};

use super::wasi::{self, Exit, Host};
use crate::wasm::{WasmCallError, WasmError};

/// How often the engine's epoch advances while a call runs: the
/// resolution of the per-call deadline.
const TICK: Duration = Duration::from_millis(10);

/// The process-wide engine: Cranelift, epoch interruption on.
pub(super) fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(true);
        Engine::new(&config).expect("the engine's configuration is valid")
    })
}

/// Advances the engine's epoch every [`TICK`] while at least one call is
/// in flight, and sleeps otherwise (no wakeups on an idle node).
struct Ticker {
    active: Mutex<usize>,
    wake: Condvar,
}

fn ticker() -> &'static Ticker {
    static TICKER: OnceLock<&'static Ticker> = OnceLock::new();
    TICKER.get_or_init(|| {
        let t: &'static Ticker = Box::leak(Box::new(Ticker {
            active: Mutex::new(0),
            wake: Condvar::new(),
        }));
        let spawned = std::thread::Builder::new()
            .name("nri-wasm-epoch".into())
            .spawn(move || {
                loop {
                    {
                        let mut active = lock(&t.active);
                        while *active == 0 {
                            active = t.wake.wait(active).unwrap_or_else(std::sync::PoisonError::into_inner);
                        }
                    }
                    std::thread::sleep(TICK);
                    engine().increment_epoch();
                }
            });
        if let Err(e) = spawned {
            // Without it no call can be interrupted: each call then waits
            // for the async side's backstop, which drops the plugin.
            tracing::error!(error = %e, "cannot start the WebAssembly epoch thread");
        }
        t
    })
}

/// Held while a call runs.
struct InFlight;

impl InFlight {
    fn new() -> InFlight {
        let t = ticker();
        *lock(&t.active) += 1;
        t.wake.notify_one();
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        *lock(&ticker().active) -= 1;
    }
}

/// A compiled module, shared with every plugin of the same content; the
/// cache entry goes when the last one is dropped.
pub(super) struct Compiled {
    key: [u8; 32],
    pub module: Module,
}

type Cache = Mutex<HashMap<[u8; 32], (Module, usize)>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

impl Compiled {
    /// The module of `bytes`, compiled once per content (blocking: run it
    /// off the async threads, a large module takes seconds).
    pub fn get(bytes: &[u8]) -> Result<Compiled, WasmError> {
        let key: [u8; 32] = Sha256::digest(bytes).into();
        if let Some((module, users)) = lock(cache()).get_mut(&key) {
            *users += 1;
            return Ok(Compiled {
                key,
                module: module.clone(),
            });
        }
        let module = Module::new(engine(), bytes).map_err(|e| WasmError::Compile(format!("{e:#}")))?;
        let mut cache = lock(cache());
        let entry = cache.entry(key).or_insert_with(|| (module, 0));
        entry.1 += 1;
        Ok(Compiled {
            key,
            module: entry.0.clone(),
        })
    }

    /// Whether a module of this content is in the cache (for tests).
    #[cfg(test)]
    pub fn cached(bytes: &[u8]) -> bool {
        let key: [u8; 32] = Sha256::digest(bytes).into();
        lock(cache()).contains_key(&key)
    }
}

impl Drop for Compiled {
    fn drop(&mut self) {
        let mut cache = lock(cache());
        if let Some(entry) = cache.get_mut(&self.key) {
            entry.1 -= 1;
            if entry.1 == 0 {
                cache.remove(&self.key);
            }
        }
    }
}

/// How one call failed.
#[derive(Debug)]
pub(super) enum CallFailure {
    /// Interrupted at its deadline.
    Timeout,
    /// The plugin's own error text (bit 31 of the answer).
    Returned(String),
    /// The calling convention or the sandbox was broken.
    Wasm(WasmCallError),
}

/// Exports every module must have (those of NRI v0.9's bindings).
pub(super) const REQUIRED: [&str; 7] = [
    "plugin_configure",
    "plugin_synchronize",
    "plugin_shutdown",
    "plugin_create_container",
    "plugin_update_container",
    "plugin_stop_container",
    "plugin_state_change",
];

/// Exports a module may lack: the dedicated notifications (else
/// `plugin_state_change`), UpdatePodSandbox and validation (else not
/// subscribed).
pub(super) const OPTIONAL: [&str; 11] = [
    "plugin_run_pod_sandbox",
    "plugin_stop_pod_sandbox",
    "plugin_remove_pod_sandbox",
    "plugin_post_create_container",
    "plugin_start_container",
    "plugin_post_start_container",
    "plugin_post_update_container",
    "plugin_remove_container",
    "plugin_post_update_pod_sandbox",
    "plugin_update_pod_sandbox",
    "plugin_validate_container_adjustment",
];

/// A plugin's instance.
pub(super) struct Guest {
    store: Store<Host>,
    memory: Memory,
    malloc: TypedFunc<i32, i32>,
    free: TypedFunc<i32, ()>,
    exports: HashMap<&'static str, TypedFunc<(i32, i32), i64>>,
    /// Set by a failure that leaves the instance unusable.
    stopped: bool,
    /// Holds the module's cache entry.
    _compiled: Arc<Compiled>,
}

fn typed<P, R>(
    instance: &Instance,
    store: &mut Store<Host>,
    name: &'static str,
    expected: &'static str,
) -> Result<Option<TypedFunc<P, R>>, WasmError>
where
    P: wasmtime::WasmParams,
    R: wasmtime::WasmResults,
{
    match instance.get_export(&mut *store, name) {
        None => Ok(None),
        Some(e) => match e.into_func().map(|f| f.typed::<P, R>(&*store)) {
            Some(Ok(f)) => Ok(Some(f)),
            _ => Err(WasmError::ExportType {
                name: name.to_string(),
                expected,
            }),
        },
    }
}

fn required<P, R>(
    instance: &Instance,
    store: &mut Store<Host>,
    name: &'static str,
    expected: &'static str,
) -> Result<TypedFunc<P, R>, WasmError>
where
    P: wasmtime::WasmParams,
    R: wasmtime::WasmResults,
{
    typed(instance, store, name, expected)?.ok_or(WasmError::MissingExport(name))
}

const REQUEST_TYPE: &str = "func (i32, i32) -> i64";

impl Guest {
    /// Instantiates `compiled` for plugin `plugin` (`IDX-NAME`) with the
    /// granted environment and memory limit, runs `_initialize` under
    /// `init_timeout`, checks the API version and the exports.
    pub fn load(
        plugin: String,
        compiled: Arc<Compiled>,
        env: Vec<String>,
        memory_limit: u64,
        init_timeout: Duration,
    ) -> Result<Guest, WasmError> {
        let module = &compiled.module;
        wasi::check_imports(module)?;
        let mut linker = Linker::new(engine());
        linker.allow_shadowing(true);
        wasi::define(&mut linker, module).map_err(|e| WasmError::Instantiate(format!("{e:#}")))?;
        let mut store = Store::new(engine(), Host::new(plugin, env, memory_limit));
        store.limiter(|h| &mut h.cap);
        // Instantiation runs the module's start function, if any: under
        // the same deadline as `_initialize`.
        store.data_mut().begin(Instant::now() + init_timeout);
        store.set_epoch_deadline(ticks(init_timeout));
        let instantiated = {
            let _in_flight = InFlight::new();
            linker.instantiate(&mut store, module)
        };
        store.data_mut().end();
        let instance = instantiated.map_err(|e| {
            if store.data().cap.hit {
                WasmError::Instantiate(format!("its initial memory exceeds the limit of {memory_limit} bytes"))
            } else {
                WasmError::Instantiate(format!("{e:#}"))
            }
        })?;
        let memory = match instance.get_export(&mut store, "memory") {
            Some(e) => e.into_memory().ok_or(WasmError::ExportType {
                name: "memory".into(),
                expected: "memory",
            })?,
            None => return Err(WasmError::MissingExport("memory")),
        };
        let malloc = required::<i32, i32>(&instance, &mut store, "malloc", "func (i32) -> i32")?;
        let free = required::<i32, ()>(&instance, &mut store, "free", "func (i32)")?;
        let version = required::<(), i64>(&instance, &mut store, "plugin_api_version", "func () -> i64")?;
        let init = typed::<(), ()>(&instance, &mut store, "_initialize", "func ()")?;
        let mut exports = HashMap::new();
        for name in REQUIRED {
            exports.insert(name, required(&instance, &mut store, name, REQUEST_TYPE)?);
        }
        for name in OPTIONAL {
            if let Some(f) = typed(&instance, &mut store, name, REQUEST_TYPE)? {
                exports.insert(name, f);
            }
        }
        let mut guest = Guest {
            store,
            memory,
            malloc,
            free,
            exports,
            stopped: false,
            _compiled: compiled,
        };
        if let Some(init) = init {
            guest
                .run(init_timeout, |store| init.call(store, ()))
                .map_err(|f| start_error("_initialize", f, init_timeout))?;
        }
        let v = guest
            .run(init_timeout, |store| version.call(store, ()))
            .map_err(|f| start_error("plugin_api_version", f, init_timeout))?;
        if v != 1 {
            return Err(WasmError::ApiVersion(v));
        }
        Ok(guest)
    }

    /// Whether the module exports `name`.
    pub fn has(&self, name: &str) -> bool {
        self.exports.contains_key(name)
    }

    /// Runs `f` (a call into the guest) under a deadline of `timeout`,
    /// classifying its failure; a failure that leaves the instance
    /// unusable stops it.
    fn run<T>(
        &mut self,
        timeout: Duration,
        f: impl FnOnce(&mut Store<Host>) -> wasmtime::Result<T>,
    ) -> Result<T, CallFailure> {
        if self.stopped {
            return Err(CallFailure::Wasm(WasmCallError::Stopped));
        }
        let deadline = Instant::now() + timeout;
        self.store.data_mut().begin(deadline);
        self.store.set_epoch_deadline(ticks(timeout));
        let r = {
            let _in_flight = InFlight::new();
            f(&mut self.store)
        };
        self.store.data_mut().end();
        r.map_err(|e| {
            self.stopped = true;
            self.classify(e)
        })
    }

    fn classify(&self, e: wasmtime::Error) -> CallFailure {
        let host = self.store.data();
        if let Some(Exit(code)) = e.downcast_ref::<Exit>() {
            return CallFailure::Wasm(WasmCallError::Exited(*code));
        }
        if matches!(e.downcast_ref::<Trap>(), Some(Trap::Interrupt)) {
            return CallFailure::Timeout;
        }
        let stderr = host.last_stderr();
        if host.cap.hit {
            return CallFailure::Wasm(WasmCallError::OutOfMemory {
                limit: host.cap.limit,
                stderr,
            });
        }
        let trap = match e.downcast_ref::<Trap>() {
            Some(t) => t.to_string(),
            None => format!("{e:#}"),
        };
        CallFailure::Wasm(WasmCallError::Trap { trap, stderr })
    }

    /// Calls `plugin_<request>` export `export` with the encoded request
    /// `req`: its encoded answer, or how it failed. The deadline covers
    /// allocating the request, the call and freeing the answer.
    pub fn call(&mut self, export: &str, req: &[u8], timeout: Duration) -> Result<Vec<u8>, CallFailure> {
        let Some(func) = self.exports.get(export).cloned() else {
            return Err(CallFailure::Wasm(WasmCallError::Garbage(format!(
                "{export} is not exported"
            ))));
        };
        let (malloc, free, memory) = (self.malloc.clone(), self.free.clone(), self.memory);
        let len = i32::try_from(req.len()).map_err(|_| {
            CallFailure::Wasm(WasmCallError::Garbage(format!(
                "a request of {} bytes is too large",
                req.len()
            )))
        })?;
        let answer = self.run(timeout, move |store| {
            let ptr = if len > 0 {
                let ptr = malloc.call(&mut *store, len)?;
                if ptr == 0 || memory.write(&mut *store, ptr as u32 as usize, req).is_err() {
                    return Ok(Err(format!(
                        "malloc({len}) gave {ptr:#x}, no room for the request in a memory of {} bytes",
                        memory.data_size(&*store)
                    )));
                }
                ptr
            } else {
                0
            };
            let packed = func.call(&mut *store, (ptr, len))? as u64;
            if ptr != 0 {
                free.call(&mut *store, ptr)?;
            }
            let (at, size) = ((packed >> 32) as u32, packed as u32);
            let (is_error, size) = (size & (1 << 31) != 0, size & !(1 << 31));
            let data = memory.data(&*store);
            let Some(bytes) = data.get(at as usize..at as usize + size as usize).map(<[u8]>::to_vec) else {
                return Ok(Err(format!(
                    "its answer of {size} bytes at offset {at:#x} lies outside its memory of {} bytes",
                    data.len()
                )));
            };
            if at != 0 {
                free.call(&mut *store, at as i32)?;
            }
            Ok(Ok((is_error, bytes)))
        })?;
        match answer {
            Ok((false, bytes)) => Ok(bytes),
            Ok((true, text)) => Err(CallFailure::Returned(String::from_utf8_lossy(&text).into_owned())),
            Err(garbage) => Err(CallFailure::Wasm(WasmCallError::Garbage(garbage))),
        }
    }
}

/// Epoch ticks for a deadline of `timeout` (one more: the current tick may
/// be about to end).
fn ticks(timeout: Duration) -> u64 {
    (timeout.as_nanos() / TICK.as_nanos()) as u64 + 2
}

fn start_error(export: &'static str, f: CallFailure, timeout: Duration) -> WasmError {
    let source = match f {
        CallFailure::Timeout => WasmCallError::Trap {
            trap: format!("did not return within {timeout:?}"),
            stderr: None,
        },
        CallFailure::Returned(text) => WasmCallError::Garbage(text),
        CallFailure::Wasm(e) => e,
    };
    WasmError::Start { export, source }
}
