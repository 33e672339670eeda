//! The runtime options of a task (`CreateTaskRequest.options`, a protobuf
//! `Any`): what containerd passes from the handler's `options` table or
//! from `ctr run`.
//!
//! Two shapes reach a shim, depending on the handler's `runtime_type`:
//!
//! - `containerd.runc.v1.Options` (runc's own options message) when the
//!   type is `io.containerd.runc.v2` (a handler that runs this shim
//!   through `runtime_path`, where containerd honours it):
//!   `systemd_cgroup` is field 9, a bool.
//! - `runtimeoptions.v1.Options` for any other type (ours,
//!   `io.containerd.nri-shim.v2`): `config_path` (field 2) names a TOML
//!   file, `config_body` (field 3, containerd 1.7+) holds the handler's
//!   `options` table as TOML. containerd 1.6's CRI sends only the path
//!   (the table's `ConfigPath = FILE` key, as Kata's handlers use it);
//!   `ctr run --runtime-config-path FILE` sends it too.
//!
//! Only `SystemdCgroup` (the systemd cgroup driver) is read; other keys,
//! and messages of other types, are ignored, as runc's shim ignores what
//! it does not know.

use std::path::Path;

use protobuf::CodedInputStream;
use protobuf::well_known_types::any::Any;

use crate::error::{Result, ShimError};

/// What the shim takes from a task's runtime options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// `SystemdCgroup = true`: the container's cgroup is a transient
    /// systemd scope (runc's systemd driver).
    pub systemd_cgroup: bool,
}

/// Type URL suffix of runc's options message.
const RUNC_OPTIONS: &str = "containerd.runc.v1.Options";
/// Type URL suffix of containerd's generic runtime options message.
const RUNTIME_OPTIONS: &str = "runtimeoptions.v1.Options";

/// The `SystemdCgroup` key of a TOML options table.
#[derive(serde::Deserialize, Default)]
struct TomlOptions {
    #[serde(rename = "SystemdCgroup", default)]
    systemd_cgroup: bool,
}

impl RuntimeOptions {
    /// Reads the options of a CreateTaskRequest (`None` or an empty `Any`:
    /// the defaults).
    ///
    /// # Errors
    /// [`ShimError::InvalidArgument`] when a message of a known type does
    /// not decode, or its TOML (body or the file at `config_path`) cannot
    /// be read or parsed; the message names what was wrong.
    pub fn parse(any: Option<&Any>) -> Result<RuntimeOptions> {
        let Some(any) = any.filter(|a| !a.type_url.is_empty()) else {
            return Ok(RuntimeOptions::default());
        };
        let bad =
            |e: &dyn std::fmt::Display| ShimError::InvalidArgument(format!("runtime options {}: {e}", any.type_url));
        if any.type_url.ends_with(RUNC_OPTIONS) {
            let mut systemd_cgroup = false;
            let mut input = CodedInputStream::from_bytes(&any.value);
            while let Some(tag) = input.read_raw_tag_or_eof().map_err(|e| bad(&e))? {
                if tag == 9 << 3 {
                    systemd_cgroup = input.read_bool().map_err(|e| bad(&e))?;
                } else {
                    protobuf::rt::skip_field_for_tag(tag, &mut input).map_err(|e| bad(&e))?;
                }
            }
            return Ok(RuntimeOptions { systemd_cgroup });
        }
        if any.type_url.ends_with(RUNTIME_OPTIONS) {
            let (mut path, mut body) = (String::new(), Vec::new());
            let mut input = CodedInputStream::from_bytes(&any.value);
            while let Some(tag) = input.read_raw_tag_or_eof().map_err(|e| bad(&e))? {
                match tag {
                    t if t == (2 << 3) | 2 => path = input.read_string().map_err(|e| bad(&e))?,
                    t if t == (3 << 3) | 2 => body = input.read_bytes().map_err(|e| bad(&e))?,
                    _ => protobuf::rt::skip_field_for_tag(tag, &mut input).map_err(|e| bad(&e))?,
                }
            }
            let (text, from) = if !body.is_empty() {
                (String::from_utf8_lossy(&body).into_owned(), "config_body".to_string())
            } else if !path.is_empty() {
                let text = std::fs::read_to_string(Path::new(&path)).map_err(|e| bad(&format!("{path}: {e}")))?;
                (text, path)
            } else {
                return Ok(RuntimeOptions::default());
            };
            let t: TomlOptions = toml::from_str(&text).map_err(|e| bad(&format!("{from}: {e}")))?;
            return Ok(RuntimeOptions {
                systemd_cgroup: t.systemd_cgroup,
            });
        }
        tracing::debug!(type_url = %any.type_url, "runtime options of an unknown type ignored");
        Ok(RuntimeOptions::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(type_url: &str, value: &[u8]) -> Any {
        Any {
            type_url: type_url.into(),
            value: value.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn runc_options_field_9_is_systemd_cgroup() {
        // binary_name = "runc" (field 6), then systemd_cgroup = true.
        let on = any("containerd.runc.v1.Options", b"\x32\x04runc\x48\x01");
        assert!(RuntimeOptions::parse(Some(&on)).unwrap().systemd_cgroup);
        let off = any("containerd.runc.v1.Options", b"\x32\x04runc");
        assert!(!RuntimeOptions::parse(Some(&off)).unwrap().systemd_cgroup);
        // Field 8 (a string) with the value 1 is not field 9.
        let other = any("containerd.runc.v1.Options", b"\x42\x01\x01");
        assert!(!RuntimeOptions::parse(Some(&other)).unwrap().systemd_cgroup);
        let bad = any("containerd.runc.v1.Options", b"\x48");
        assert!(matches!(
            RuntimeOptions::parse(Some(&bad)),
            Err(ShimError::InvalidArgument(_))
        ));
    }

    #[test]
    fn runtime_options_body_or_file_is_toml() {
        let body = b"SystemdCgroup = true\nBinaryName = \"x\"\n";
        let mut v = vec![0x1a, body.len() as u8];
        v.extend_from_slice(body);
        let o = any("type.googleapis.com/runtimeoptions.v1.Options", &v);
        assert!(RuntimeOptions::parse(Some(&o)).unwrap().systemd_cgroup);

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("opts.toml");
        std::fs::write(&file, "SystemdCgroup = true\n").unwrap();
        let p = file.display().to_string();
        let mut v = vec![0x12, p.len() as u8];
        v.extend_from_slice(p.as_bytes());
        let o = any("runtimeoptions.v1.Options", &v);
        assert!(RuntimeOptions::parse(Some(&o)).unwrap().systemd_cgroup);

        std::fs::write(&file, "SystemdCgroup = \"yes\"\n").unwrap();
        let e = RuntimeOptions::parse(Some(&o)).unwrap_err().to_string();
        assert!(e.contains(&p), "{e}");
        std::fs::remove_file(&file).unwrap();
        let e = RuntimeOptions::parse(Some(&o)).unwrap_err().to_string();
        assert!(e.contains(&p), "{e}");
    }

    #[test]
    fn no_or_unknown_options_are_the_defaults() {
        assert_eq!(RuntimeOptions::parse(None).unwrap(), RuntimeOptions::default());
        let o = any("example.com/Other", b"\x48\x01");
        assert_eq!(RuntimeOptions::parse(Some(&o)).unwrap(), RuntimeOptions::default());
        let empty = any("runtimeoptions.v1.Options", b"");
        assert_eq!(RuntimeOptions::parse(Some(&empty)).unwrap(), RuntimeOptions::default());
    }
}
