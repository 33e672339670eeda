//! `adjuster`: a WebAssembly NRI plugin that adjusts the containers it is
//! told to, from its configuration (the plugin's drop-in file in
//! `plugin_config_path`, passed in Configure). One rule a line:
//!
//! ```text
//! env KEY=VALUE                    # add or replace an environment variable
//! mount DEST SOURCE TYPE [OPT,..]  # add a mount
//! annotation KEY=VALUE             # add an annotation
//! memory-limit BYTES               # set the memory limit
//! cpu-shares N                     # set the CPU shares
//! container NAME                   # adjust only containers named NAME (repeatable)
//! reject-container NAME            # fail CreateContainer of containers named NAME
//! reject-env KEY                   # as a validator: reject adjustments that set KEY
//! host-env KEY                     # add KEY=<the plugin's own $KEY, or "unset">
//! host-file PATH KEY               # add KEY=<first line of PATH, or "unreadable">
//! log                              # log every request it gets
//! events NAME[,NAME]               # subscribe to these events instead
//! ```
//!
//! `host-env` and `host-file` show what the runtime's sandbox grants: no
//! environment and no file system unless its configuration says so.
//!
//! Build (Rust 1.63 or later; Debian 12: packages rustc and
//! libstd-rust-dev-wasm32; newer toolchains call the target wasm32-wasip1):
//!
//! ```text
//! rustc --edition 2021 -O --target wasm32-wasi --crate-type cdylib adjuster.rs \
//!     -C link-arg=--export=malloc -C link-arg=--export=free \
//!     -C link-arg=$(rustc --print sysroot)/lib/rustlib/wasm32-wasi/lib/self-contained/crt1-reactor.o \
//!     -o adjuster.wasm
//! ```
//!
//! (`crt1-reactor.o` makes it a WASI reactor: `_initialize` runs the
//! constructors once; without it the linker wraps every export in them.)

mod abi;
mod pb;

use std::sync::Mutex;

use abi::{log, Level, Request};
use pb::{Reader, Writer};

#[derive(Default)]
struct Config {
    env: Vec<(String, String)>,
    mounts: Vec<(String, String, String, Vec<String>)>,
    annotations: Vec<(String, String)>,
    memory_limit: Option<i64>,
    cpu_shares: Option<u64>,
    containers: Vec<String>,
    reject_containers: Vec<String>,
    reject_env: Vec<String>,
    host_env: Vec<String>,
    host_files: Vec<(String, String)>,
    log: bool,
    events: Option<u32>,
}

static CONFIG: Mutex<Option<Config>> = Mutex::new(None);

/// Event numbers of `api.proto`'s `Event`, by lower-case name.
fn event_number(name: &str) -> Result<u32, String> {
    const NAMES: [&str; 14] = [
        "run_pod_sandbox",
        "stop_pod_sandbox",
        "remove_pod_sandbox",
        "create_container",
        "post_create_container",
        "start_container",
        "post_start_container",
        "update_container",
        "post_update_container",
        "stop_container",
        "remove_container",
        "update_pod_sandbox",
        "post_update_pod_sandbox",
        "validate_container_adjustment",
    ];
    NAMES
        .iter()
        .position(|n| *n == name)
        .map(|i| i as u32 + 1)
        .ok_or_else(|| format!("unknown event {:?}", name))
}

fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {:?}", s)),
    }
}

fn parse_config(text: &str) -> Result<Config, String> {
    let mut c = Config::default();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let bad = || format!("line {}: cannot read {:?}", n + 1, line);
        match (words[0], words.len()) {
            ("env", 2) => c.env.push(key_value(words[1])?),
            ("annotation", 2) => c.annotations.push(key_value(words[1])?),
            ("mount", 4) | ("mount", 5) => {
                let opts = words.get(4).map(|o| o.split(',').map(str::to_string).collect()).unwrap_or_default();
                c.mounts.push((words[1].to_string(), words[2].to_string(), words[3].to_string(), opts));
            }
            ("memory-limit", 2) => c.memory_limit = Some(words[1].parse().map_err(|_| bad())?),
            ("cpu-shares", 2) => c.cpu_shares = Some(words[1].parse().map_err(|_| bad())?),
            ("container", 2) => c.containers.push(words[1].to_string()),
            ("reject-container", 2) => c.reject_containers.push(words[1].to_string()),
            ("reject-env", 2) => c.reject_env.push(words[1].to_string()),
            ("host-env", 2) => c.host_env.push(words[1].to_string()),
            ("host-file", 3) => c.host_files.push((words[1].to_string(), words[2].to_string())),
            ("log", 1) => c.log = true,
            ("events", 2) => {
                let mut mask = 0u32;
                for name in words[1].split(',') {
                    mask |= 1 << (event_number(name)? - 1);
                }
                c.events = Some(mask);
            }
            _ => return Err(bad()),
        }
    }
    Ok(c)
}

/// The events it subscribes to: CreateContainer, and validation when it
/// has `reject-env` rules, unless `events` says otherwise.
fn events(c: &Config) -> u32 {
    if let Some(mask) = c.events {
        return mask;
    }
    let mut mask = 1 << (4 - 1);
    if !c.reject_env.is_empty() {
        mask |= 1 << (14 - 1);
    }
    mask
}

fn configure(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let text = Reader::string(bytes, 1)?;
    let runtime = Reader::string(bytes, 2)?;
    let config = parse_config(text).map_err(|e| format!("invalid adjuster configuration: {}", e))?;
    log(
        Level::Info,
        &format!(
            "WASM adjuster configured by {}: {} env, {} mounts, {} annotations",
            runtime,
            config.env.len(),
            config.mounts.len(),
            config.annotations.len()
        ),
    );
    let mut rsp = Writer::new();
    rsp.varint(2, u64::from(events(&config)));
    *CONFIG.lock().unwrap() = Some(config);
    Ok(rsp.buf)
}

fn host_file(path: &str) -> String {
    match std::fs::read_to_string(path) {
        Ok(s) => s.lines().next().unwrap_or("").to_string(),
        Err(_) => "unreadable".to_string(),
    }
}

fn create_container(c: &Config, bytes: &[u8]) -> Result<Vec<u8>, String> {
    let pod = Reader::message(bytes, 1)?;
    let ctr = Reader::message(bytes, 2)?;
    let name = Reader::string(ctr, 3)?;
    if c.log {
        log(
            Level::Info,
            &format!(
                "WASM adjuster: CreateContainer {}/{}/{} ({} annotations)",
                Reader::string(pod, 4)?,
                Reader::string(pod, 2)?,
                name,
                Reader::string_map(ctr, 6)?.len()
            ),
        );
    }
    if c.reject_containers.iter().any(|r| r == name) {
        return Err(format!("container {} is refused by the WASM adjuster", name));
    }
    if !c.containers.is_empty() && !c.containers.iter().any(|n| n == name) {
        return Ok(Vec::new());
    }
    let mut adjust = Writer::new();
    for (k, v) in &c.annotations {
        adjust.map_entry(2, k, v);
    }
    for (dest, source, kind, opts) in &c.mounts {
        let mut m = Writer::new();
        m.string(1, dest).string(2, kind).string(3, source);
        for o in opts {
            m.string(4, o);
        }
        adjust.message(3, &m);
    }
    let mut env: Vec<(String, String)> = c.env.clone();
    for key in &c.host_env {
        env.push((key.clone(), std::env::var(key).unwrap_or_else(|_| "unset".to_string())));
    }
    for (path, key) in &c.host_files {
        env.push((key.clone(), host_file(path)));
    }
    for (k, v) in &env {
        let mut kv = Writer::new();
        kv.string(1, k).string(2, v);
        adjust.message(4, &kv);
    }
    if c.memory_limit.is_some() || c.cpu_shares.is_some() {
        let mut resources = Writer::new();
        if let Some(limit) = c.memory_limit {
            let mut value = Writer::new();
            value.varint(1, limit as u64);
            let mut memory = Writer::new();
            memory.message(1, &value);
            resources.message(1, &memory);
        }
        if let Some(shares) = c.cpu_shares {
            let mut value = Writer::new();
            value.varint(1, shares);
            let mut cpu = Writer::new();
            cpu.message(1, &value);
            resources.message(2, &cpu);
        }
        let mut linux = Writer::new();
        linux.message(2, &resources);
        adjust.message(6, &linux);
    }
    let mut rsp = Writer::new();
    rsp.message(1, &adjust);
    Ok(rsp.buf)
}

fn validate(c: &Config, bytes: &[u8]) -> Result<Vec<u8>, String> {
    let adjust = Reader::message(bytes, 3)?;
    let mut refused = None;
    Reader::each(adjust, 4, |kv| {
        let key = Reader::string(kv.bytes()?, 1)?;
        if refused.is_none() && c.reject_env.iter().any(|r| r == key) {
            refused = Some(key.to_string());
        }
        Ok(())
    })?;
    let mut rsp = Writer::new();
    if let Some(key) = refused {
        rsp.varint(1, 1)
            .string(2, &format!("environment variable {} is not allowed by the WASM adjuster", key));
    }
    Ok(rsp.buf)
}

/// Called by every `plugin_<request>` export (see `abi`).
pub fn handle(req: Request, bytes: &[u8]) -> Result<Vec<u8>, String> {
    if req == Request::Configure {
        return configure(bytes);
    }
    let guard = CONFIG.lock().unwrap();
    let c = guard.as_ref().ok_or("request before Configure")?;
    if c.log && req != Request::CreateContainer {
        log(Level::Info, &format!("WASM adjuster: {:?} ({} bytes)", req, bytes.len()));
    }
    match req {
        Request::CreateContainer => create_container(c, bytes),
        Request::ValidateContainerAdjustment => validate(c, bytes),
        _ => Ok(Vec::new()),
    }
}
