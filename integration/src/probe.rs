//! What an unprivileged local user can get at: the `nri-nobody-probe`
//! binary runs as `nobody` (uid and gid 65534, no supplementary groups)
//! and tries the paths it is given, as such a user would: open each file,
//! list each directory, connect to each socket; then it reads everything it
//! can under the given roots and says where a marker string appears.
//!
//! The paths to try are enumerated by root ([`tree`]), so that the probe
//! also tries what `nobody` could never have found by listing.

use std::{
    collections::BTreeMap,
    io::Read as _,
    os::unix::fs::{FileTypeExt, OpenOptionsExt},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde::{Deserialize, Serialize};

/// The uid and gid the probe runs as (Debian's `nobody` and `nogroup`).
pub const NOBODY: u32 = 65534;

/// What the probe is asked (JSON on its stdin).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct ProbeRequest {
    /// Paths to open, list or connect to, by their type.
    pub paths: Vec<PathBuf>,
    /// Trees to read whole, looking for the markers.
    pub search: Vec<PathBuf>,
    /// Strings that must not be readable.
    pub markers: Vec<String>,
}

/// What the probe could do (JSON on its stdout).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeReport {
    /// The uid it ran as.
    pub uid: u32,
    /// Files (and fifos) of `paths` it could open for reading.
    pub readable: Vec<PathBuf>,
    /// Directories of `paths` it could list.
    pub listable: Vec<PathBuf>,
    /// Sockets of `paths` it could connect to.
    pub connectable: Vec<PathBuf>,
    /// Of `paths`, how many were tried (some may have vanished meanwhile).
    pub tried: usize,
    /// Marker -> the readable files under `search` that contain it.
    pub found: BTreeMap<String, Vec<PathBuf>>,
    /// Files under `search` it read.
    pub files_read: usize,
}

impl ProbeReport {
    /// Nothing was readable, listable or connectable, and no marker found.
    pub fn is_private(&self) -> bool {
        self.readable.is_empty()
            && self.listable.is_empty()
            && self.connectable.is_empty()
            && self.found.values().all(Vec::is_empty)
    }

    /// One line: the counts, then what was reachable.
    pub fn summary(&self) -> String {
        let found: Vec<String> = self
            .found
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(m, v)| format!("{m} in {v:?}"))
            .collect();
        format!(
            "tried {} paths as uid {}: {} readable {:?}, {} listable {:?}, {} connectable {:?}; \
             read {} files, markers found: {}",
            self.tried,
            self.uid,
            self.readable.len(),
            self.readable,
            self.listable.len(),
            self.listable,
            self.connectable.len(),
            self.connectable,
            self.files_read,
            if found.is_empty() {
                "none".into()
            } else {
                found.join("; ")
            }
        )
    }
}

/// `root` and everything below it that the caller can list, not following
/// symbolic links.
pub fn tree(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            for e in std::fs::read_dir(&p).into_iter().flatten().flatten() {
                stack.push(e.path());
            }
        }
        out.push(p);
    }
    out
}

/// Runs the probe binary `bin` as [`NOBODY`] with `req`.
///
/// # Panics
/// When the probe cannot run or answers no report: a test that cannot
/// probe must fail, not pass.
pub fn run_as_nobody(bin: &Path, req: &ProbeRequest) -> ProbeReport {
    use std::{io::Write as _, os::unix::process::CommandExt as _};
    // std drops the supplementary groups (setgroups) when a uid is set, so
    // root's group 0 does not come along.
    let mut child = Command::new(bin)
        .uid(NOBODY)
        .gid(NOBODY)
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {} as nobody: {e}", bin.display()));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&serde_json::to_vec(req).unwrap())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{} as nobody: {}\n{}",
        bin.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: ProbeReport = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("probe report: {e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(report.uid, NOBODY, "the probe did not run as nobody");
    report
}

/// The probe itself (the binary's body): tries `req` as the calling user.
pub fn probe(req: &ProbeRequest) -> ProbeReport {
    let mut r = ProbeReport {
        // SAFETY: getuid has no preconditions.
        uid: unsafe { libc::getuid() },
        ..Default::default()
    };
    for p in &req.paths {
        let Ok(meta) = std::fs::symlink_metadata(p) else {
            // Not even stat-able: its directory cannot be passed through.
            r.tried += 1;
            continue;
        };
        r.tried += 1;
        let ft = meta.file_type();
        if ft.is_dir() {
            if std::fs::read_dir(p).is_ok() {
                r.listable.push(p.clone());
            }
        } else if ft.is_socket() {
            if std::os::unix::net::UnixStream::connect(p).is_ok() {
                r.connectable.push(p.clone());
            }
        } else if !ft.is_symlink() && open_read(p).is_ok() {
            r.readable.push(p.clone());
        }
    }
    for m in &req.markers {
        r.found.insert(m.clone(), Vec::new());
    }
    for p in req.search.iter().flat_map(|root| tree(root)) {
        if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_file()) {
            let mut data = Vec::new();
            if open_read(&p)
                .and_then(|f| f.take(64 << 20).read_to_end(&mut data))
                .is_ok()
            {
                r.files_read += 1;
                for m in &req.markers {
                    if data.windows(m.len()).any(|w| w == m.as_bytes()) {
                        r.found.get_mut(m).unwrap().push(p.clone());
                    }
                }
            }
        }
    }
    r
}

/// Opens for reading without blocking on a fifo.
fn open_read(p: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(p)
}
