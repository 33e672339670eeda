//! CDI (Container Device Interface): device requests by fully qualified
//! name (`vendor.com/class=name`), resolved from the CDI spec files of the
//! configured directories (`[cdi] spec_dirs`, default `/etc/cdi` then
//! `/var/run/cdi`) and applied to the OCI spec as containerd and CRI-O do.
//!
//! Requests come from two places:
//! * the `cdi.k8s.io/*` annotations of the container's spec (a
//!   comma-separated list of device names per key, the form kubelet's
//!   device plugins use), injected before NRI's CreateContainer so plugins
//!   see the devices, as containerd's CRI plugin does when it resolves
//!   them itself;
//! * NRI plugins' `CDI_devices` adjustments, injected where the NRI
//!   adjustment order puts them (after hooks, before devices).
//!
//! Spec files are `*.json` and `*.yaml` (JSON is read as YAML), read on
//! every request, so a file written by a device driver is seen by the next
//! container. A directory later in the list wins over an earlier one; two
//! files of one directory defining the same device are a conflict, but
//! only for a container that asks for that device. A file that cannot be
//! read is named in the error of a device it might have defined.
//!
//! Every error names the device and, where there is one, the spec file.
//! Nothing is applied unless every requested device resolves: the spec is
//! unchanged on error.
//!
//! Pure code over the OCI spec and the CDI spec files: may use only
//! `container::bundle`'s hook names; the task code calls it.

mod edits;
pub mod spec;
#[cfg(test)]
mod tests;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use self::{
    edits::{Merged, Origin},
    spec::{SpecFile, parse_qualified},
};

/// Annotation key prefix of CDI device requests (`cdi.k8s.io/<anything>`).
pub const ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// The spec directories when the configuration names none, lowest
/// priority first.
pub const DEFAULT_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// Why CDI devices could not be injected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CdiError {
    /// A requested name is not `vendor.com/class=name`.
    #[error("invalid CDI device name {name:?}: {reason}")]
    InvalidName {
        /// The name as requested.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A `cdi.k8s.io/*` annotation holds something else than device names.
    #[error("annotation {key}: invalid CDI device name {name:?}: {reason}")]
    InvalidAnnotation {
        /// The annotation key.
        key: String,
        /// The offending list entry.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No spec file defines the device.
    #[error("unknown CDI device {device}: no spec file in {dirs} defines it{detail}")]
    Unknown {
        /// The requested device.
        device: String,
        /// The directories searched.
        dirs: String,
        /// What was found instead (`; ...`), or nothing.
        detail: String,
    },
    /// Two spec files of the same directory define the device.
    #[error("conflicting CDI device {device}: defined by both {first} and {second}")]
    Duplicate {
        /// The requested device.
        device: String,
        /// One spec file.
        first: PathBuf,
        /// The other.
        second: PathBuf,
    },
    /// The spec file defining the device is invalid.
    #[error("invalid CDI spec {file} for device {device}: {reason}")]
    BadSpec {
        /// The spec file.
        file: PathBuf,
        /// The requested device.
        device: String,
        /// What is wrong, and where.
        reason: String,
    },
    /// Two requested devices want different things at one place.
    #[error("conflicting CDI devices: {first} and {second} both set {what}, differently")]
    Conflict {
        /// The place: `env NAME`, `device node PATH`, `mount PATH`.
        what: String,
        /// The first device (and its file).
        first: String,
        /// The second device (and its file).
        second: String,
    },
    /// A device node's missing details could not be read from the host.
    #[error("CDI device {device}: host device {path}: {reason}")]
    HostDevice {
        /// The device (and its file).
        device: String,
        /// The host path.
        path: PathBuf,
        /// What is wrong (errno text, type mismatch).
        reason: String,
    },
}

/// The device names requested by `cdi.k8s.io/*` annotations, in key
/// order, each once.
///
/// # Errors
/// [`CdiError::InvalidAnnotation`] for an entry that is not a fully
/// qualified device name.
pub fn annotation_devices(annotations: Option<&HashMap<String, String>>) -> Result<Vec<String>, CdiError> {
    let Some(annotations) = annotations else {
        return Ok(Vec::new());
    };
    let mut keys: Vec<&String> = annotations
        .keys()
        .filter(|k| k.starts_with(ANNOTATION_PREFIX))
        .collect();
    keys.sort();
    let mut out: Vec<String> = Vec::new();
    for key in keys {
        for name in annotations[key].split(',').map(str::trim) {
            parse_qualified(name).map_err(|reason| CdiError::InvalidAnnotation {
                key: key.clone(),
                name: name.into(),
                reason,
            })?;
            if !out.iter().any(|n| n == name) {
                out.push(name.into());
            }
        }
    }
    Ok(out)
}

/// One spec file as read.
struct Loaded {
    file: PathBuf,
    /// Index of its directory: higher wins.
    priority: usize,
    spec: Result<SpecFile, String>,
}

/// The CDI spec directories, read on each injection.
#[derive(Debug, Clone)]
pub struct Registry {
    dirs: Vec<PathBuf>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new(DEFAULT_SPEC_DIRS.iter().map(PathBuf::from).collect())
    }
}

impl Registry {
    /// A registry over `dirs`, lowest priority first.
    pub fn new(dirs: Vec<PathBuf>) -> Registry {
        Registry { dirs }
    }

    /// The directories, lowest priority first.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Resolves `devices` and applies their edits to `spec`; nothing
    /// changes unless all resolve.
    ///
    /// # Errors
    /// [`CdiError`], naming the device and spec file.
    pub fn inject(&self, spec: &mut oci_spec::runtime::Spec, devices: &[String]) -> Result<(), CdiError> {
        if devices.is_empty() {
            return Ok(());
        }
        let merged = self.resolve(devices)?;
        merged.apply(spec);
        Ok(())
    }

    fn load(&self) -> Vec<Loaded> {
        let mut out = Vec::new();
        for (priority, dir) in self.dirs.iter().enumerate() {
            let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
                Ok(entries) => entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "json" || x == "yaml"))
                    .collect(),
                // A directory nobody created yet has no devices.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    out.push(Loaded {
                        file: dir.clone(),
                        priority,
                        spec: Err(format!("cannot read directory: {e}")),
                    });
                    continue;
                }
            };
            files.sort();
            for file in files {
                let spec = std::fs::read(&file)
                    .map_err(|e| e.to_string())
                    .and_then(|text| serde_yaml_ng::from_slice::<SpecFile>(&text).map_err(|e| e.to_string()));
                out.push(Loaded { file, priority, spec });
            }
        }
        out
    }

    fn resolve(&self, devices: &[String]) -> Result<Merged, CdiError> {
        let loaded = self.load();
        let mut merged = Merged::default();
        let mut used_files: Vec<&Path> = Vec::new();
        let mut done: Vec<&str> = Vec::new();
        for device in devices {
            if done.contains(&device.as_str()) {
                continue;
            }
            done.push(device);
            let (kind, name) = parse_qualified(device).map_err(|reason| CdiError::InvalidName {
                name: device.clone(),
                reason,
            })?;
            let (l, spec) = self.find(&loaded, device, kind, name)?;
            let bad = |reason: String| CdiError::BadSpec {
                file: l.file.clone(),
                device: device.clone(),
                reason,
            };
            spec.check().map_err(&bad)?;
            let dev = spec.devices.iter().find(|d| d.name == name).expect("found by name");
            if !used_files.contains(&l.file.as_path()) {
                used_files.push(&l.file);
                if let Some(common) = &spec.container_edits {
                    common.check().map_err(|e| bad(format!("containerEdits: {e}")))?;
                    let origin = Origin {
                        what: kind.to_string(),
                        file: l.file.clone(),
                    };
                    merged.add(common, &origin)?;
                }
            }
            dev.container_edits
                .check()
                .map_err(|e| bad(format!("device {name:?}: containerEdits: {e}")))?;
            let origin = Origin {
                what: device.clone(),
                file: l.file.clone(),
            };
            merged.add(&dev.container_edits, &origin)?;
        }
        Ok(merged)
    }

    /// The file that defines `device`: the highest priority one.
    fn find<'l>(
        &self,
        loaded: &'l [Loaded],
        device: &str,
        kind: &str,
        name: &str,
    ) -> Result<(&'l Loaded, &'l SpecFile), CdiError> {
        let mut best: Option<(&Loaded, &SpecFile)> = None;
        for l in loaded {
            let Ok(spec) = &l.spec else { continue };
            if spec.kind != kind || !spec.devices.iter().any(|d| d.name == name) {
                continue;
            }
            match best {
                Some((b, _)) if b.priority == l.priority => {
                    return Err(CdiError::Duplicate {
                        device: device.into(),
                        first: b.file.clone(),
                        second: l.file.clone(),
                    });
                }
                _ => best = Some((l, spec)),
            }
        }
        if let Some(found) = best {
            return Ok(found);
        }
        // Say what there is instead: the kind's files and their devices,
        // and the files that could not be read.
        let mut detail = String::new();
        for l in loaded {
            match &l.spec {
                Ok(spec) if spec.kind == kind => {
                    let names: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
                    detail.push_str(&format!(
                        "; {} defines kind {kind} with devices {}",
                        l.file.display(),
                        names.join(", ")
                    ));
                }
                Ok(_) => {}
                Err(e) => detail.push_str(&format!("; unreadable spec file {}: {e}", l.file.display())),
            }
        }
        Err(CdiError::Unknown {
            device: device.into(),
            dirs: self
                .dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            detail,
        })
    }
}
