//! containerd's shim bootstrap: what `start` reads on stdin and what it
//! answers on stdout.
//!
//! - containerd 1.6 takes `start`'s stdout, as is, for the task address
//!   (and speaks task API v2).
//! - containerd 1.7 and 2.x first try to read it as a JSON bootstrap result
//!   `{"version", "address", "protocol"}` and fall back to the plain
//!   address (then task API v2). Version 3 makes 2.x speak task API v3
//!   (`containerd.task.v3.Task`), as it does with its own runc shim; 1.7
//!   refuses any version above 2.
//! - containerd 2.3 and later write a protobuf
//!   `containerd.runtime.bootstrap.v1.BootstrapParams` on `start`'s stdin
//!   (instance id, namespace, its own version and addresses), meant to
//!   replace the `-id`, `-namespace`, `-address` flags and `TTRPC_ADDRESS`,
//!   and first try to read `start`'s stdout as a protobuf
//!   `BootstrapResult` (version, address, protocol). Up to 2.2 stdin
//!   carries the runtime options (a protobuf `Any`) or nothing. An `Any`
//!   decodes as parameters too (its fields 1 and 2 are strings), so
//!   parameters count only when their instance id and namespace are the
//!   command line's, as containerd's own shims check.
//!
//! So `start` answers with a protobuf `BootstrapResult`, version 3, when
//! containerd sent parameters; else with the JSON result, version 3, when
//! `<publish-binary> --version` (containerd itself; its Go module path ends
//! in `/v2` from 2.0 on) says 2.x, remembered per binary in the daemon
//! directory; anything else, or a version it cannot tell, gets the plain
//! address every containerd reads (and task API v2).

use std::{
    io::Read as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use protobuf::{CodedInputStream, CodedOutputStream};

use crate::node::args::Flags;

/// The task API version `start` announces to containerd 2.x.
pub const TASK_API_V3: i32 = 3;

/// How long `<containerd> --version` may take.
const VERSION_TIMEOUT: Duration = Duration::from_secs(5);

/// The fields of containerd's `BootstrapParams` (2.3+) the shim uses;
/// the others (log level, extensions, socket directory) are skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BootstrapParams {
    /// Field 1: the task (container or sandbox) id.
    pub instance_id: String,
    /// Field 2: containerd namespace of the task.
    pub namespace: String,
    /// Field 4: containerd's version (`2.3.0`, ...).
    pub containerd_version: String,
    /// Field 5: containerd's ttrpc address (events are published there).
    pub containerd_ttrpc_address: String,
    /// Field 6: containerd's gRPC address (the daemon is keyed on it).
    pub containerd_grpc_address: String,
    /// Field 7: the containerd binary.
    pub containerd_binary: String,
}

impl BootstrapParams {
    /// Decodes `stdin` as a protobuf `BootstrapParams`; `None` when it is
    /// empty or not one.
    pub fn decode(stdin: &[u8]) -> Option<BootstrapParams> {
        if stdin.is_empty() {
            return None;
        }
        let mut p = BootstrapParams::default();
        let mut input = CodedInputStream::from_bytes(stdin);
        while let Some(tag) = input.read_raw_tag_or_eof().ok()? {
            let (field, wire) = (tag >> 3, tag & 7);
            let slot = match field {
                1 => Some(&mut p.instance_id),
                2 => Some(&mut p.namespace),
                4 => Some(&mut p.containerd_version),
                5 => Some(&mut p.containerd_ttrpc_address),
                6 => Some(&mut p.containerd_grpc_address),
                7 => Some(&mut p.containerd_binary),
                _ => None,
            };
            match slot {
                // Length-delimited is the only wire type of a string.
                Some(slot) if wire == 2 => *slot = input.read_string().ok()?,
                Some(_) => return None,
                None => protobuf::rt::skip_field_for_tag(tag, &mut input).ok()?,
            }
        }
        Some(p)
    }

    /// The parameters containerd sent, if `stdin` holds them for this
    /// task: decoded, with the instance id and namespace of `flags` (when
    /// given on the command line).
    pub fn for_task(stdin: &[u8], flags: &Flags) -> Option<BootstrapParams> {
        let p = BootstrapParams::decode(stdin)?;
        let same = |flag: &str, value: &str| flag.is_empty() || flag == value;
        (!p.instance_id.is_empty()
            && !p.namespace.is_empty()
            && same(&flags.id, &p.instance_id)
            && same(&flags.namespace, &p.namespace))
        .then_some(p)
    }

    /// Fills what the command line left out (containerd may stop passing
    /// the flags): namespace, id, address (a `unix://` prefix removed) and
    /// publish binary.
    pub fn fill(&self, flags: &mut Flags) {
        let fill = |field: &mut String, value: &str| {
            if field.is_empty() {
                *field = value.to_string();
            }
        };
        fill(&mut flags.namespace, &self.namespace);
        fill(&mut flags.id, &self.instance_id);
        fill(
            &mut flags.address,
            self.containerd_grpc_address
                .strip_prefix("unix://")
                .unwrap_or(&self.containerd_grpc_address),
        );
        fill(&mut flags.publish_binary, &self.containerd_binary);
    }

    /// containerd's ttrpc address, when given.
    pub fn ttrpc_address(&self) -> Option<&str> {
        Some(self.containerd_ttrpc_address.as_str()).filter(|a| !a.is_empty())
    }
}

/// Reads `start`'s stdin to its end, unless it is a terminal (run by
/// hand). A read error counts as nothing sent.
pub fn read_stdin() -> Vec<u8> {
    use std::io::IsTerminal as _;
    let mut stdin = std::io::stdin().lock();
    let mut buf = Vec::new();
    if !stdin.is_terminal() {
        let _ = stdin.read_to_end(&mut buf);
    }
    buf
}

/// The major version in a containerd version string (`2.1.9+unknown`,
/// `v1.7.24`, `1.6.20~ds1`).
pub fn major_of(version: &str) -> Option<u32> {
    version.trim().trim_start_matches('v').split('.').next()?.parse().ok()
}

/// containerd's major version from its `--version` line
/// (`containerd github.com/containerd/containerd/v2 2.1.9+unknown`): the
/// third word, else the module path's `/vN` suffix.
pub fn major_of_version_line(line: &str) -> Option<u32> {
    let words: Vec<&str> = line.split_whitespace().collect();
    words
        .get(2)
        .and_then(|v| major_of(v))
        .or_else(|| words.get(1)?.rsplit_once("/v")?.1.parse().ok())
}

/// What `start` answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// The plain address: containerd 1.6 and 1.7, or a version not known
    /// (task API v2 everywhere).
    Plain,
    /// The JSON bootstrap result with version 3: containerd 2.0 to 2.2.
    JsonV3,
    /// The protobuf `BootstrapResult` with version 3: containerd that sent
    /// bootstrap parameters (2.3+).
    ProtoV3,
}

/// The reply for containerd: [`Reply::ProtoV3`] with parameters, else
/// [`Reply::JsonV3`] when `detect` (asked only then) says major version 2
/// or later, else [`Reply::Plain`].
pub fn reply(params: Option<&BootstrapParams>, detect: impl FnOnce() -> Option<u32>) -> Reply {
    if params.is_some() {
        return Reply::ProtoV3;
    }
    match detect() {
        Some(m) if m >= 2 => Reply::JsonV3,
        _ => Reply::Plain,
    }
}

/// What `start` prints for `reply`.
pub fn render(address: &str, reply: Reply) -> Vec<u8> {
    match reply {
        Reply::Plain => address.as_bytes().to_vec(),
        Reply::JsonV3 => serde_json::json!({ "version": TASK_API_V3, "address": address, "protocol": "ttrpc" })
            .to_string()
            .into_bytes(),
        Reply::ProtoV3 => {
            let mut out = Vec::new();
            let mut os = CodedOutputStream::vec(&mut out);
            // Writing to a Vec cannot fail.
            os.write_int32(1, TASK_API_V3).expect("encode to memory");
            os.write_string(2, address).expect("encode to memory");
            os.write_string(3, "ttrpc").expect("encode to memory");
            os.flush().expect("encode to memory");
            drop(os);
            out
        }
    }
}

/// The major version of the containerd binary `binary`, remembered in
/// `cache_dir/containerd-version` for as long as the binary file is the
/// same (path, inode, size, mtime). `None` when it cannot be run or read.
pub fn containerd_major(binary: &str, cache_dir: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt as _;
    if binary.is_empty() {
        return None;
    }
    let meta = std::fs::metadata(binary).ok()?;
    let key = format!(
        "{binary}\t{}\t{}\t{}",
        meta.ino(),
        meta.size(),
        meta.mtime_nsec() + meta.mtime() * 1_000_000_000
    );
    let cache: PathBuf = cache_dir.join("containerd-version");
    if let Ok(text) = std::fs::read_to_string(&cache) {
        if let Some((k, major)) = text.trim_end().rsplit_once('\t') {
            if k == key {
                return major.parse().ok();
            }
        }
    }
    let major = major_of_version_line(&run_version(binary)?)?;
    // Whole or not at all: a concurrent `start` reads either file (each
    // writes its own temp file, named by its pid).
    let _ = crate::private::write_atomic(
        &cache,
        &std::process::id().to_string(),
        format!("{key}\t{major}\n").as_bytes(),
        false,
    );
    Some(major)
}

/// `binary --version`'s first line, within [`VERSION_TIMEOUT`].
fn run_version(binary: &str) -> Option<String> {
    let mut child = std::process::Command::new(binary)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + VERSION_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let mut out = String::new();
    child.stdout.take()?.read_to_string(&mut out).ok()?;
    out.lines().next().map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_lines_of_the_three_debian_containerds() {
        for (line, major) in [
            (
                "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3",
                1,
            ),
            (
                "containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1",
                1,
            ),
            ("containerd github.com/containerd/containerd/v2 2.1.9+unknown ", 2),
            ("containerd github.com/containerd/containerd/v2 v2.3.0 abcdef", 2),
            ("containerd github.com/containerd/containerd/v2", 2),
        ] {
            assert_eq!(major_of_version_line(line), Some(major), "{line}");
        }
        assert_eq!(major_of_version_line("containerd"), None);
        assert_eq!(major_of_version_line(""), None);
    }

    /// `BootstrapParams` as containerd 2.3 encodes it (fields in order,
    /// log level and an extension included).
    fn params_bytes(id: &str, ns: &str) -> Vec<u8> {
        let mut out = Vec::new();
        let mut os = CodedOutputStream::vec(&mut out);
        os.write_string(1, id).unwrap();
        os.write_string(2, ns).unwrap();
        os.write_enum(3, -4).unwrap();
        os.write_string(4, "2.3.0").unwrap();
        os.write_string(5, "unix:///run/c.sock.ttrpc").unwrap();
        os.write_string(6, "unix:///run/c.sock").unwrap();
        os.write_string(7, "/usr/bin/containerd").unwrap();
        // extensions: a message holding an Any (type URL only).
        os.write_bytes(8, b"\x0a\x03\x0a\x01x").unwrap();
        os.write_string(9, "/run/s").unwrap();
        os.flush().unwrap();
        drop(os);
        out
    }

    #[test]
    fn reply_per_containerd_generation() {
        let addr = "unix:///run/nri-shim/x/task.sock";
        assert_eq!(reply(None, || Some(1)), Reply::Plain);
        assert_eq!(reply(None, || None), Reply::Plain);
        assert_eq!(reply(None, || Some(2)), Reply::JsonV3);
        let p = BootstrapParams::default();
        assert_eq!(reply(Some(&p), || panic!("detected although told")), Reply::ProtoV3);
        assert_eq!(render(addr, Reply::Plain), addr.as_bytes());
        let v: serde_json::Value = serde_json::from_slice(&render(addr, Reply::JsonV3)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"version": 3, "address": addr, "protocol": "ttrpc"})
        );
        // The protobuf result decodes field by field as containerd reads it.
        let bytes = render(addr, Reply::ProtoV3);
        let mut is = CodedInputStream::from_bytes(&bytes);
        assert_eq!(is.read_raw_tag_or_eof().unwrap(), Some(1 << 3));
        assert_eq!(is.read_int32().unwrap(), 3);
        assert_eq!(is.read_raw_tag_or_eof().unwrap(), Some((2 << 3) | 2));
        assert_eq!(is.read_string().unwrap(), addr);
        assert_eq!(is.read_raw_tag_or_eof().unwrap(), Some((3 << 3) | 2));
        assert_eq!(is.read_string().unwrap(), "ttrpc");
        assert_eq!(is.read_raw_tag_or_eof().unwrap(), None);
    }

    #[test]
    fn bootstrap_params_fill_missing_flags_and_must_name_the_task() {
        let bytes = params_bytes("c1", "k8s.io");
        let p = BootstrapParams::decode(&bytes).unwrap();
        assert_eq!(
            p,
            BootstrapParams {
                instance_id: "c1".into(),
                namespace: "k8s.io".into(),
                containerd_version: "2.3.0".into(),
                containerd_ttrpc_address: "unix:///run/c.sock.ttrpc".into(),
                containerd_grpc_address: "unix:///run/c.sock".into(),
                containerd_binary: "/usr/bin/containerd".into(),
            }
        );
        let mut flags = Flags {
            namespace: "k8s.io".into(),
            ..Default::default()
        };
        let p = BootstrapParams::for_task(&bytes, &flags).unwrap();
        p.fill(&mut flags);
        assert_eq!(
            (
                flags.namespace.as_str(),
                flags.id.as_str(),
                flags.address.as_str(),
                flags.publish_binary.as_str()
            ),
            ("k8s.io", "c1", "/run/c.sock", "/usr/bin/containerd"),
        );
        assert_eq!(p.ttrpc_address(), Some("unix:///run/c.sock.ttrpc"));
        // Another task's or namespace's parameters are not ours.
        let other = Flags {
            id: "c2".into(),
            namespace: "k8s.io".into(),
            ..Default::default()
        };
        assert_eq!(BootstrapParams::for_task(&bytes, &other), None);
        // Runtime options (an Any: type URL and value decode as fields 1
        // and 2), nothing, or junk: no parameters.
        let runc_opts = b"\x0a\x1acontainerd.runc.v1.Options\x12\x02\x08\x01";
        let flags = Flags {
            id: "c1".into(),
            namespace: "k8s.io".into(),
            ..Default::default()
        };
        assert_eq!(BootstrapParams::for_task(runc_opts, &flags), None);
        assert_eq!(BootstrapParams::for_task(b"", &flags), None);
        assert_eq!(BootstrapParams::for_task(b"{not proto", &flags), None);
    }

    #[test]
    fn containerd_major_runs_the_binary_once_per_file() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("containerd");
        let counter = dir.path().join("runs");
        std::fs::write(
            &bin,
            format!(
                "#!/bin/sh\necho x >> {}\necho 'containerd github.com/containerd/containerd/v2 2.1.9+unknown '\n",
                counter.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let b = bin.to_str().unwrap();
        assert_eq!(containerd_major(b, dir.path()), Some(2));
        assert_eq!(containerd_major(b, dir.path()), Some(2));
        assert_eq!(std::fs::read_to_string(&counter).unwrap().lines().count(), 1);
        assert_eq!(containerd_major("/nonexistent/containerd", dir.path()), None);
        assert_eq!(containerd_major("", dir.path()), None);
    }
}
