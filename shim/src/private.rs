//! Files and directories only root may read: everything the shim keeps on
//! a node.
//!
//! The shim's state holds what plugins injected into containers (the
//! merged adjustment in the audit records, the adjusted `config.json`, an
//! exec's `process.json`, libcontainer's state with the annotations): env
//! values, hook arguments, mount sources, annotation values, any of which
//! may be a secret. So every directory the daemon, its helpers, `start` and
//! `delete` create is `0700` ([`DIR_MODE`]) and every file `0600`
//! ([`FILE_MODE`]), given on the `mkdir`/`open` itself: there is no moment
//! in which a looser mode exists (a `chmod` after the create would leave
//! one). The process umask can only take bits away from these modes, so
//! they hold under any umask containerd gives the shim; the umask itself is
//! left alone, because containers, OCI hooks and libcontainer's rootfs
//! preparation inherit it (as they inherit it from runc's shim).
//!
//! containerd keeps its bundles `0700` (`0711` where a user-namespaced
//! container must reach its rootfs) and runc keeps its state root `0700`;
//! both tightened their modes after CVE-2021-41103. The one exception here
//! is [`TRAVERSE_MODE`], for the two directories of a bundle that a
//! container's user-namespace root must pass through (see its doc).
//!
//! [`tighten`] brings a state root written by an older nri-shim (`0755`
//! directories, `0644` files) to these modes at the daemon's start (which
//! an in-place upgrade's new daemon also runs).

use std::{
    fs::{DirBuilder, File, OpenOptions},
    io::{self, Write as _},
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

/// Mode of every directory the shim creates in its state root and bundles.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file the shim creates (records, logs, locks, sockets).
pub const FILE_MODE: u32 = 0o600;
/// Mode of the bundle directories a user-namespaced container's root must
/// traverse, owned by root: the bundle's `rootfs` mount point (as
/// containerd's runc shim creates it) and the directory of bind mounts
/// staged with an ID mapping; the container's init binds them from inside
/// its user namespace, where root of the host's namespace is not its
/// owner. `--x` for others: they can pass through, not list.
pub const TRAVERSE_MODE: u32 = 0o711;

/// Creates `path` and any missing parent, each `0700`. An existing
/// directory keeps its mode ([`tighten`] is for those).
///
/// # Errors
/// The `mkdir` that failed, with the path in the message.
pub fn create_dir_all(path: &Path) -> io::Result<()> {
    dir_with_mode(path, DIR_MODE)
}

/// [`create_dir_all`] with `mode` for each directory it creates.
///
/// # Errors
/// The `mkdir` that failed, with the path in the message.
pub fn dir_with_mode(path: &Path, mode: u32) -> io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(|e| with_path(e, "create directory", path))
}

/// Options that create a file `0600` (when it does not exist yet).
pub fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(FILE_MODE);
    o
}

/// Creates (or truncates) `path` for writing, `0600` when new.
///
/// # Errors
/// The `open` that failed, with the path in the message.
pub fn create(path: &Path) -> io::Result<File> {
    options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| with_path(e, "create", path))
}

/// Opens `path` for appending, created `0600` when new.
///
/// # Errors
/// The `open` that failed, with the path in the message.
pub fn append(path: &Path) -> io::Result<File> {
    options()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| with_path(e, "open", path))
}

/// Writes `data` to `path` (created `0600`, or truncated).
///
/// # Errors
/// The `open` or `write` that failed, with the path in the message.
pub fn write(path: &Path, data: impl AsRef<[u8]>) -> io::Result<()> {
    create(path)?
        .write_all(data.as_ref())
        .map_err(|e| with_path(e, "write", path))
}

/// Writes `data` to `path` atomically: a `0600` temp file beside it
/// (`<path>.<suffix>`), synced when `sync`, then renamed over `path`, so a
/// reader sees the old file or the new one, never a part.
///
/// # Errors
/// The create, write, sync or rename that failed, with the path.
pub fn write_atomic(path: &Path, suffix: &str, data: &[u8], sync: bool) -> io::Result<()> {
    replace(path, suffix, data, sync, FILE_MODE)
}

/// [`write_atomic`] with `mode` for the new file, for a file that is not
/// the shim's own (containerd's `config.toml` keeps the mode it had). A
/// temp file an earlier run left behind is removed first: the file renamed
/// into place is always one this call created, with `mode`, never a
/// leftover with a looser one.
///
/// # Errors
/// The create, write, sync or rename that failed, with the path.
pub fn replace(path: &Path, suffix: &str, data: &[u8], sync: bool, mode: u32) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".");
    tmp.push(suffix);
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|e| with_path(e, "create", &tmp))?;
    f.write_all(data)
        .and_then(|()| if sync { f.sync_all() } else { Ok(()) })
        .map_err(|e| with_path(e, "write", &tmp))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        with_path(e, "rename into place", path)
    })
}

/// What [`tighten`] changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tightened {
    /// Paths whose mode was narrowed, each with its old mode (permission
    /// bits), in walk order.
    pub changed: Vec<(PathBuf, u32)>,
    /// Paths that could not be narrowed, with the error.
    pub failed: Vec<(PathBuf, String)>,
}

/// Narrows every entry of the tree at `root` (itself included) that grants
/// anything to group or others: directories to `0700`, files and sockets
/// to their owner's bits (`0644` becomes `0600`). Symbolic links are not
/// followed, and the walk stays on `root`'s filesystem (a mount inside is
/// somebody else's). A missing `root` is nothing to do.
///
/// For a state root written by an older nri-shim, whose directories were
/// `0755` and files `0644` (see the module doc).
pub fn tighten(root: &Path) -> Tightened {
    let mut out = Tightened::default();
    let Ok(meta) = std::fs::symlink_metadata(root) else {
        return out;
    };
    let dev = meta.dev();
    let mut stack = vec![(root.to_path_buf(), meta)];
    while let Some((path, meta)) = stack.pop() {
        let ft = meta.file_type();
        if ft.is_symlink() || meta.dev() != dev {
            continue;
        }
        let mode = meta.permissions().mode() & 0o7777;
        let want = if ft.is_dir() { DIR_MODE } else { mode & 0o700 };
        if mode & 0o077 != 0 {
            match std::fs::set_permissions(&path, std::fs::Permissions::from_mode(want)) {
                Ok(()) => out.changed.push((path.clone(), mode)),
                Err(e) => out.failed.push((path.clone(), e.to_string())),
            }
        }
        if ft.is_dir() {
            match std::fs::read_dir(&path) {
                Ok(entries) => {
                    for e in entries.flatten() {
                        if let Ok(m) = e.metadata() {
                            stack.push((e.path(), m));
                        }
                    }
                }
                Err(e) => out.failed.push((path, e.to_string())),
            }
        }
    }
    out
}

/// `root`'s tree made private ([`tighten`]); says so in the log, once,
/// when anything was looser (a state root left by an older nri-shim).
pub fn tighten_and_log(root: &Path) {
    let t = tighten(root);
    if !t.changed.is_empty() {
        let examples: Vec<String> = t
            .changed
            .iter()
            .take(3)
            .map(|(p, m)| format!("{} was {m:04o}", p.display()))
            .collect();
        tracing::warn!(
            root = %root.display(),
            count = t.changed.len(),
            examples = %examples.join(", "),
            "state readable by other users (left by an older nri-shim) made private: directories 0700, files 0600"
        );
    }
    for (p, e) in t.failed.iter().take(3) {
        tracing::warn!(path = %p.display(), error = %e, "cannot make state private");
    }
}

fn with_path(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// Runs `f` with the process umask 0 (the loosest containerd could give
    /// the shim), restoring it after. Tests of this module only: the umask
    /// is process-wide, and these tests create only in their own temp dirs.
    fn with_umask_0<T>(f: impl FnOnce() -> T) -> T {
        let _guard = UMASK.lock().unwrap();
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
        let r = f();
        nix::sys::stat::umask(old);
        r
    }
    static UMASK: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn creates_are_private_under_any_umask() {
        let d = tempfile::tempdir().unwrap();
        with_umask_0(|| {
            create_dir_all(&d.path().join("a/b/c")).unwrap();
            write(&d.path().join("a/b/f"), "x").unwrap();
            drop(append(&d.path().join("a/log")).unwrap());
            write_atomic(&d.path().join("a/b/c/rec.json"), "tmp", b"{}", true).unwrap();
            dir_with_mode(&d.path().join("a/rootfs"), TRAVERSE_MODE).unwrap();
        });
        for p in ["a", "a/b", "a/b/c"] {
            assert_eq!(mode(&d.path().join(p)), 0o700, "{p}");
        }
        for p in ["a/b/f", "a/log", "a/b/c/rec.json"] {
            assert_eq!(mode(&d.path().join(p)), 0o600, "{p}");
        }
        assert_eq!(mode(&d.path().join("a/rootfs")), 0o711);
        assert!(!d.path().join("a/b/c/rec.json.tmp").exists());
    }

    #[test]
    fn a_leftover_temp_file_is_not_what_lands() {
        let d = tempfile::tempdir().unwrap();
        let (path, tmp) = (d.path().join("rec.json"), d.path().join("rec.json.tmp"));
        // An older version's crash left its temp file, readable by all.
        std::fs::write(&tmp, "old").unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_atomic(&path, "tmp", b"new", false).unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert!(!tmp.exists());
        // Another file's own mode, kept.
        replace(&path, "tmp", b"x", false, 0o640).unwrap();
        assert_eq!(mode(&path), 0o640);
    }

    #[test]
    fn an_existing_file_keeps_its_mode_when_rewritten() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        std::fs::write(&f, "old").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        write(&f, "new").unwrap();
        assert_eq!(mode(&f), 0o640);
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "new");
    }

    #[test]
    fn tighten_narrows_what_an_older_version_left_and_reports_it() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("state");
        let loose = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        std::fs::create_dir_all(root.join("h/audit/k8s.io")).unwrap();
        std::fs::write(root.join("h/audit/k8s.io/c1.json"), "secret").unwrap();
        std::fs::write(root.join("h/shim.log"), "log").unwrap();
        std::fs::write(root.join("h/private"), "").unwrap();
        let outside = d.path().join("outside");
        std::fs::write(&outside, "").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("h/link")).unwrap();
        for p in ["", "h", "h/audit", "h/audit/k8s.io"] {
            loose(&root.join(p), 0o755);
        }
        loose(&root.join("h/audit/k8s.io/c1.json"), 0o644);
        loose(&root.join("h/shim.log"), 0o664);
        loose(&root.join("h/private"), 0o600);
        loose(&outside, 0o644);

        let t = tighten(&root);
        assert!(t.failed.is_empty(), "{t:?}");
        let mut changed: Vec<_> = t
            .changed
            .iter()
            .map(|(p, m)| (p.strip_prefix(&root).unwrap().display().to_string(), *m))
            .collect();
        changed.sort();
        assert_eq!(
            changed,
            [
                ("".to_string(), 0o755),
                ("h".into(), 0o755),
                ("h/audit".into(), 0o755),
                ("h/audit/k8s.io".into(), 0o755),
                ("h/audit/k8s.io/c1.json".into(), 0o644),
                ("h/shim.log".into(), 0o664),
            ]
        );
        for p in ["", "h", "h/audit", "h/audit/k8s.io"] {
            assert_eq!(mode(&root.join(p)), 0o700, "{p}");
        }
        assert_eq!(mode(&root.join("h/audit/k8s.io/c1.json")), 0o600);
        assert_eq!(mode(&root.join("h/shim.log")), 0o600);
        // A link is not followed: what it names is not ours.
        assert_eq!(mode(&outside), 0o644);
        // Nothing left to do the second time.
        assert_eq!(tighten(&root), Tightened::default());
        assert_eq!(tighten(&d.path().join("missing")), Tightened::default());
    }
}
