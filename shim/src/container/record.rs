//! What the shim leaves in a task's bundle at `start`, so that the task
//! outlives the processes that know about it:
//!
//! - `address`: the ttrpc address `start` printed. containerd 1.6 and 1.7
//!   read it on restart to reconnect to a running shim; without it they
//!   log "cleaning up after shim disconnected", run `<shim> delete` and
//!   forget the task. (containerd 2.x also keeps a bootstrap record next
//!   to it; the record here has a version field to grow with that.)
//! - `nri-shim.json` ([`TaskRecord`]): where the daemon serving the task
//!   keeps its socket and libcontainer's state. `delete` reads it instead of
//!   the shim config, so it cleans up whatever the config file holds now
//!   (an operator mid-edit, a changed `state_root`), and without a daemon.
//!   The daemon removes it when the task's delete is complete: a bundle
//!   without one has nothing left to clean up.
//!
//! The container's cgroup is not recorded: `delete` reads
//! `linux.cgroupsPath` from the bundle's `config.json`, which the daemon
//! rewrites with the plugins' adjustments before libcontainer runs it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// containerd's reconnect record in the bundle.
pub const ADDRESS_FILE: &str = "address";
/// The shim's own record in the bundle.
pub const RECORD_FILE: &str = "nri-shim.json";
/// Current [`TaskRecord::version`].
pub const RECORD_VERSION: u32 = 1;

/// Reading or writing a bundle record failed.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The file could not be written (or renamed into place).
    #[error("write {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file exists but could not be read.
    #[error("read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file could not be removed.
    #[error("remove {path}")]
    Remove {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not a record this shim understands.
    #[error("parse {path}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: serde_json::Error,
    },
}

/// Where the daemon serving a task keeps its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// [`RECORD_VERSION`] when written.
    pub version: u32,
    /// containerd namespace of the task.
    pub namespace: String,
    /// Task id.
    pub id: String,
    /// The daemon's directory (`<state_root>/<hash of containerd's address>`).
    pub daemon_dir: PathBuf,
}

impl TaskRecord {
    /// The daemon's task socket.
    pub fn socket(&self) -> PathBuf {
        crate::layout::task_socket(&self.daemon_dir)
    }

    /// libcontainer's state root (one directory per container).
    pub fn libcontainer_root(&self) -> PathBuf {
        crate::layout::libcontainer_root(&self.daemon_dir)
    }

    /// Writes the record into `bundle` (atomically: readers see the old
    /// record or the new one).
    ///
    /// # Errors
    /// [`RecordError::Write`].
    pub fn write(&self, bundle: &Path) -> Result<(), RecordError> {
        let json = serde_json::to_vec_pretty(self).map_err(|e| RecordError::Parse {
            path: bundle.join(RECORD_FILE),
            source: e,
        })?;
        write_atomic(&bundle.join(RECORD_FILE), &json)
    }

    /// The record in `bundle`; `None` when there is none (a bundle of
    /// another shim, or a task whose `start` never ran).
    ///
    /// # Errors
    /// [`RecordError::Read`], [`RecordError::Parse`].
    pub fn read(bundle: &Path) -> Result<Option<TaskRecord>, RecordError> {
        let path = bundle.join(RECORD_FILE);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|source| RecordError::Parse { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(RecordError::Read { path, source }),
        }
    }

    /// Removes the record from `bundle`. The daemon does so once the
    /// task's delete is complete (libcontainer's state, the cgroup and the
    /// rootfs mounts are gone): `delete`, which containerd runs after every
    /// task delete, then finds nothing to clean up and skips its work. A
    /// record already gone is no error.
    ///
    /// # Errors
    /// [`RecordError::Remove`].
    pub fn remove(bundle: &Path) -> Result<(), RecordError> {
        let path = bundle.join(RECORD_FILE);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(RecordError::Remove { path, source: e }),
            _ => Ok(()),
        }
    }
}

/// Writes containerd's `address` file into `bundle`: exactly what `start`
/// prints (`unix:///path/task.sock`), as the runc shim writes it.
///
/// # Errors
/// [`RecordError::Write`].
pub fn write_address(bundle: &Path, address: &str) -> Result<(), RecordError> {
    write_atomic(&bundle.join(ADDRESS_FILE), address.as_bytes())
}

fn write_atomic(path: &Path, data: &[u8]) -> Result<(), RecordError> {
    let err = |source| RecordError::Write {
        path: path.to_path_buf(),
        source,
    };
    crate::private::write_atomic(path, "tmp", data, true).map_err(err)
}

/// `linux.cgroupsPath` of the bundle's `config.json`, when it has one.
/// Read leniently (only that key): the cleanup must not depend on the
/// rest of the spec parsing.
pub fn cgroups_path(bundle: &Path) -> Option<PathBuf> {
    let b = std::fs::read(bundle.join("config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&b).ok()?;
    let p = v.get("linux")?.get("cgroupsPath")?.as_str()?;
    (!p.is_empty()).then(|| PathBuf::from(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_absent_is_none() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(TaskRecord::read(d.path()).unwrap(), None);
        let r = TaskRecord {
            version: RECORD_VERSION,
            namespace: "k8s.io".into(),
            id: "c1".into(),
            daemon_dir: "/run/nri-shim/0123456789abcdef".into(),
        };
        r.write(d.path()).unwrap();
        let back = TaskRecord::read(d.path()).unwrap().unwrap();
        assert_eq!(back, r);
        assert_eq!(back.socket(), PathBuf::from("/run/nri-shim/0123456789abcdef/task.sock"));
        assert_eq!(
            back.libcontainer_root(),
            PathBuf::from("/run/nri-shim/0123456789abcdef/containers")
        );
        assert!(!d.path().join("nri-shim.json.tmp").exists());
    }

    #[test]
    fn a_damaged_record_is_an_error_naming_the_file() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(RECORD_FILE), "{").unwrap();
        let e = TaskRecord::read(d.path()).unwrap_err().to_string();
        assert!(e.contains(RECORD_FILE), "{e}");
    }

    #[test]
    fn address_is_written_as_printed() {
        let d = tempfile::tempdir().unwrap();
        write_address(d.path(), "unix:///run/nri-shim/x/task.sock").unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join(ADDRESS_FILE)).unwrap(),
            "unix:///run/nri-shim/x/task.sock"
        );
    }

    #[test]
    fn cgroups_path_is_read_alone() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(cgroups_path(d.path()), None);
        std::fs::write(
            d.path().join("config.json"),
            r#"{"ociVersion":"1.0.2","linux":{"cgroupsPath":"/default/c1","bogus":1}}"#,
        )
        .unwrap();
        assert_eq!(cgroups_path(d.path()), Some(PathBuf::from("/default/c1")));
    }
}
