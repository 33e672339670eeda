//! The OCI bundle of a task: reading and rewriting `config.json`, the
//! rootfs mounts containerd's snapshotter hands over, the exit status file,
//! and the fix-ups libcontainer needs that runc does without.

use std::path::{Path, PathBuf};

use containerd_shim_protos::types::mount::Mount;
use nix::mount::MsFlags;
use nri_adaptation::api;
use oci_spec::runtime::Spec;

use super::idmap::{self, IdMap, UserNs};
use crate::error::{Result, ShimError};

/// File in the bundle holding the init's exit status (for `delete` after
/// the daemon is gone).
pub const EXIT_STATUS_FILE: &str = "nri-shim-exit-status";

/// The hook lists of an OCI spec (`hooks.<name>`, also CDI's `hookName`),
/// in the order the runtime runs them; libcontainer runs every one.
pub const OCI_HOOKS: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// The `PATH` containerd and Docker give a process without one.
pub const DEFAULT_PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A task's bundle directory.
#[derive(Debug, Clone)]
pub struct Bundle {
    dir: PathBuf,
}

/// The spec as read, kept to restore `config.json` when a create fails.
pub struct LoadedSpec {
    /// The parsed spec.
    pub spec: Spec,
    /// The file's bytes.
    pub original: Vec<u8>,
}

impl Bundle {
    /// The bundle at `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Bundle {
        Bundle { dir: dir.into() }
    }

    /// The bundle directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `config.json`.
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("config.json")
    }

    /// Where the rootfs is mounted.
    pub fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }

    /// Reads `config.json`; a spec without `process.args` is refused
    /// (libcontainer would fail later with a less clear error).
    ///
    /// # Errors
    /// I/O errors naming the file, [`ShimError::InvalidArgument`] for a
    /// spec that does not parse or has nothing to run.
    pub fn load_spec(&self) -> Result<LoadedSpec> {
        let path = self.config_path();
        let original = std::fs::read(&path).map_err(|e| ShimError::io(format!("read {}", path.display()), e))?;
        let spec: Spec = serde_json::from_slice(&original)
            .map_err(|e| ShimError::InvalidArgument(format!("{}: {e}", path.display())))?;
        if spec
            .process()
            .as_ref()
            .is_none_or(|p| p.args().as_ref().is_none_or(|a| a.is_empty()))
        {
            return Err(ShimError::InvalidArgument(format!(
                "{}: process.args is empty: nothing to run",
                path.display()
            )));
        }
        Ok(LoadedSpec { spec, original })
    }

    /// Writes `spec` as `config.json` atomically (temp file and rename).
    ///
    /// # Errors
    /// Encoding or I/O errors naming the file.
    pub fn write_spec(&self, spec: &Spec) -> Result<()> {
        let path = self.config_path();
        let text = serde_json::to_vec(spec).map_err(|e| ShimError::Runtime(format!("encode adjusted spec: {e}")))?;
        // 0600: the adjusted spec holds what plugins injected (see
        // crate::private); only root (containerd, libcontainer) reads it.
        crate::private::write_atomic(&path, "nri-shim.tmp", &text, false)
            .map_err(|e| ShimError::io(format!("write {}", path.display()), e))
    }

    /// Puts back the `config.json` a failed create rewrote.
    pub fn restore_spec(&self, original: &[u8]) {
        let _ = std::fs::write(self.config_path(), original);
    }

    /// Records the init's exit status for a `delete` without the daemon.
    pub fn write_exit_status(&self, code: u32) {
        let _ = crate::private::write(&self.dir.join(EXIT_STATUS_FILE), code.to_string());
    }

    /// Removes a stale exit status (an id created again).
    pub fn clear_exit_status(&self) {
        let _ = std::fs::remove_file(self.dir.join(EXIT_STATUS_FILE));
    }
}

/// The spec's `root.path` (relative to the bundle when not absolute) must
/// be a directory, checked as runc checks it: libcontainer reports a
/// missing rootfs as an io error naming no path. The helper checks it
/// before libcontainer's create.
///
/// # Errors
/// [`ShimError::InvalidArgument`] naming the path and the errno.
pub fn check_rootfs(bundle: &Path, spec: &Spec) -> Result<()> {
    let Some(root) = spec.root().as_ref() else {
        return Ok(());
    };
    let path = bundle.join(root.path());
    match std::fs::metadata(&path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(ShimError::InvalidArgument(format!(
            "invalid rootfs: {}: not a directory",
            path.display()
        ))),
        Err(e) => Err(ShimError::InvalidArgument(format!(
            "invalid rootfs: stat {}: {e}",
            path.display()
        ))),
    }
}

/// Gives the process a `PATH` if it has none: libcontainer refuses to exec
/// without one (runc does not), and `ctr run --rootfs` specs have none.
/// Returns whether it added one.
pub fn default_path_env(spec: &mut Spec) -> bool {
    let Some(p) = spec.process_mut().as_mut() else {
        return false;
    };
    let mut env = p.env().clone().unwrap_or_default();
    if env.iter().any(|e| e.starts_with("PATH=")) {
        return false;
    }
    env.push(DEFAULT_PATH_ENV.to_string());
    p.set_env(Some(env));
    true
}

/// Does the spec give the container a new PID namespace? Not when it has
/// no `pid` namespace entry (host PID) or joins one by path (a pod's
/// shared PID namespace): containerd's runc shim reads it the same way to
/// decide whether to kill all of a container's processes when its init exits.
pub fn has_own_pid_namespace(spec: &Spec) -> bool {
    spec.linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .is_some_and(|ns| {
            ns.iter()
                .any(|n| n.typ() == oci_spec::runtime::LinuxNamespaceType::Pid && n.path().is_none())
        })
}

/// An exec's environment: the container's environment as NRI plugins
/// adjusted it, with the exec request's own variables winning by name.
///
/// Under CRI, containerd builds an exec's process from its own copy of the
/// container spec, which never saw the plugins' adjustments; without this,
/// `kubectl exec` would not see a variable a plugin added. Order: the
/// container's variables first (each replaced in place by the exec's value
/// of the same name), then the exec's other variables in their order.
pub fn merge_exec_env(container_env: &[String], process: &mut serde_json::Value) {
    let name = |kv: &str| kv.split_once('=').map_or(kv, |(k, _)| k).to_string();
    let exec: Vec<String> = process
        .get("env")
        .and_then(|e| e.as_array())
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    let exec_names: std::collections::HashSet<String> = exec.iter().map(|kv| name(kv)).collect();
    let mut merged: Vec<String> = Vec::with_capacity(container_env.len() + exec.len());
    let mut used = std::collections::HashSet::new();
    for kv in container_env {
        let n = name(kv);
        if exec_names.contains(&n) {
            if let Some(e) = exec.iter().rev().find(|e| name(e) == n) {
                merged.push(e.clone());
            }
            used.insert(n);
        } else {
            merged.push(kv.clone());
        }
    }
    merged.extend(exec.into_iter().filter(|e| !used.contains(&name(e))));
    if let Some(obj) = process.as_object_mut() {
        obj.insert("env".into(), serde_json::json!(merged));
    }
}

/// [`default_path_env`] for an exec's OCI process, given as JSON.
pub fn default_exec_path_env(process: &mut serde_json::Value) {
    if let Some(env) = process.get_mut("env").and_then(|e| e.as_array_mut()) {
        if !env.iter().any(|e| e.as_str().is_some_and(|s| s.starts_with("PATH="))) {
            env.push(serde_json::Value::String(DEFAULT_PATH_ENV.to_string()));
        }
    } else if let Some(obj) = process.as_object_mut() {
        obj.insert("env".into(), serde_json::json!([DEFAULT_PATH_ENV]));
    }
}

/// Mounts the task's rootfs layers (snapshotter mounts) on `target`;
/// returns what to unmount. On failure, what was mounted is undone.
///
/// Options are read as runc reads a spec mount's (libcontainer's own
/// parser): flag options (`ro`, `nosuid`, `noatime`, `rbind`, ...) become
/// mount flags, the clearing ones (`rw`, `dev`, `atime`, ...) clear them,
/// propagation options (`rprivate`, `shared`, ...) are applied by a second
/// mount call as the kernel requires, and only the rest (`lowerdir=...`,
/// `index=off`, ...) is passed to the filesystem as data.
///
/// # Errors
/// The mount error naming source, type and target;
/// [`ShimError::InvalidArgument`] for recursive attribute options
/// (`rro`, `rnosuid`, ...), which rootfs mounts do not take.
///
/// `uidmap=` and `gidmap=` (containerd's overlay snapshotter for a
/// user-namespaced pod, see [`super::idmap`]) make the layers idmapped: an
/// overlay's lower directories are mounted through idmapped read-only
/// clones (its upper directory is already owned by the pod's ids), any
/// other mount gets an idmapped clone of itself on top, as containerd's own
/// mount code does for runc.
pub fn mount_rootfs(mounts: &[Mount], target: &Path) -> Result<Vec<PathBuf>> {
    let mut done = Vec::new();
    for m in mounts {
        match mount_one(m, target) {
            Ok(count) => done.extend(std::iter::repeat_n(target.to_path_buf(), count)),
            Err(e) => {
                unmount_all(&done);
                return Err(e);
            }
        }
    }
    Ok(done)
}

/// Takes containerd's `uidmap=`/`gidmap=` options out of a rootfs mount:
/// the mapping they give, and the mount without them.
///
/// # Errors
/// [`ShimError::InvalidArgument`] when only one of the two is given or a
/// value does not parse.
fn take_idmap(m: &Mount) -> Result<Option<(IdMap, Mount)>> {
    let value = |name: &str| m.options.iter().rev().find_map(|o| o.strip_prefix(name));
    let what = || format!("rootfs mount {} ({})", m.source, m.type_);
    let map = match (value("uidmap="), value("gidmap=")) {
        (None, None) => return Ok(None),
        (Some(u), Some(g)) => IdMap::from_options(&what(), u, g)?,
        _ => {
            return Err(ShimError::InvalidArgument(format!(
                "{}: options {:?}: uidmap= and gidmap= go together",
                what(),
                m.options
            )));
        }
    };
    let mut rest = m.clone();
    rest.options
        .retain(|o| !o.starts_with("uidmap=") && !o.starts_with("gidmap="));
    Ok(Some((map, rest)))
}

/// Mount flags, filesystem data and propagation of one mount, as runc
/// reads its options.
#[derive(Debug, PartialEq)]
struct MountOptions {
    flags: MsFlags,
    data: Vec<String>,
    /// Propagation (`MS_SHARED`, ... with `MS_REC` for the `r` forms),
    /// applied by its own mount call after the mount.
    propagation: MsFlags,
}

/// Mounts `m` on `target`; returns how many mounts it stacked there (two
/// for an idmapped non-overlay mount).
fn mount_one(m: &Mount, target: &Path) -> Result<usize> {
    // The mount without the options only when it has them: the common
    // rootfs is not copied.
    let (idmap, without) = take_idmap(m)?.unzip();
    let m = without.as_ref().unwrap_or(m);
    let describe = || format!("mount rootfs {} ({}) on {}", m.source, m.type_, target.display());
    let mut o = parse_options(m)?;
    // As containerd's runc shim makes it: a user-namespaced container's
    // root passes through it.
    crate::private::dir_with_mode(target, crate::private::TRAVERSE_MODE)
        .map_err(|e| ShimError::io("create rootfs dir", e))?;
    let userns = idmap.as_ref().map(UserNs::with_map).transpose()?;
    // An idmapped overlay: each lower directory through an idmapped clone,
    // staged next to the rootfs only until the overlay holds its own
    // references to them.
    let staged = match &userns {
        Some(ns) if m.type_ == "overlay" => Some(stage_idmapped_lowers(&mut o.data, target, ns)?),
        _ => None,
    };
    let data = o.data.join(",");
    let fstype = (!m.type_.is_empty()).then_some(m.type_.as_str());
    let mounted = nix::mount::mount(
        Some(m.source.as_str()),
        target,
        fstype,
        o.flags,
        (!data.is_empty()).then_some(data.as_str()),
    );
    drop(staged);
    mounted.map_err(|e| ShimError::io(describe(), e.into()))?;
    let mut count = 1;
    if let Some(ns) = userns.as_ref().filter(|_| m.type_ != "overlay") {
        let recursive = o.flags.contains(MsFlags::MS_REC);
        let idmapped = idmap::idmapped_clone(target, ns, recursive, false).and_then(|t| idmap::attach(t, target));
        if let Err(e) = idmapped {
            unmount_all(&[target.to_path_buf()]);
            return Err(e);
        }
        count = 2;
    }
    if !o.propagation.is_empty()
        && let Err(e) = nix::mount::mount(None::<&str>, target, None::<&str>, o.propagation, None::<&str>)
    {
        unmount_all(&vec![target.to_path_buf(); count]);
        return Err(ShimError::io(format!("{}: propagation", describe()), e.into()));
    }
    Ok(count)
}

/// Mounts an overlay's lower directories through idmapped read-only
/// clones under `<bundle>/.nri-shim-idmap/<n>` and rewrites the
/// `lowerdir=` of `data` to them; dropping the result unmounts and removes
/// them (the overlay keeps private clones of its layers).
fn stage_idmapped_lowers(data: &mut [String], target: &Path, userns: &UserNs) -> Result<idmap::Staged> {
    let mut staged = idmap::Staged(Vec::new(), target.with_file_name(".nri-shim-idmap"));
    let Some(lower) = data.iter_mut().find(|d| d.starts_with("lowerdir=")) else {
        return Err(ShimError::InvalidArgument(format!(
            "idmapped overlay rootfs on {}: no lowerdir= option",
            target.display()
        )));
    };
    let mut rewritten = Vec::new();
    for (i, layer) in lower["lowerdir=".len()..].split(':').enumerate() {
        let at = staged.1.join(i.to_string());
        // Only mount points: the overlay is mounted by root of the host's
        // user namespace, which alone looks its lower directories up.
        crate::private::create_dir_all(&at).map_err(|e| ShimError::io(format!("create {}", at.display()), e))?;
        staged.0.push(at.clone());
        idmap::attach(idmap::idmapped_clone(Path::new(layer), userns, false, true)?, &at)?;
        rewritten.push(at.display().to_string());
    }
    *lower = format!("lowerdir={}", rewritten.join(":"));
    Ok(staged)
}

/// Propagation options: libcontainer's option parser treats them as
/// clearing flags (so `rbind,rprivate` would lose `MS_REC`); runc keeps
/// them apart, and so do we.
fn propagation(option: &str) -> Option<MsFlags> {
    let (rec, kind) = match option.strip_prefix('r') {
        Some(k @ ("private" | "shared" | "slave" | "unbindable")) => (MsFlags::MS_REC, k),
        _ => (MsFlags::empty(), option),
    };
    let flag = match kind {
        "private" => MsFlags::MS_PRIVATE,
        "shared" => MsFlags::MS_SHARED,
        "slave" => MsFlags::MS_SLAVE,
        "unbindable" => MsFlags::MS_UNBINDABLE,
        _ => return None,
    };
    Some(flag | rec)
}

/// Reads a mount's options as runc does: propagation apart, the rest
/// through libcontainer's own parser (flags set and cleared in order,
/// unknown options as filesystem data).
fn parse_options(m: &Mount) -> Result<MountOptions> {
    let (prop, rest): (Vec<&String>, Vec<&String>) = m.options.iter().partition(|o| propagation(o).is_some());
    let spec_mount = oci_spec::runtime::MountBuilder::default()
        .destination("/")
        .typ(m.type_.clone())
        .source(m.source.clone())
        .options(rest.into_iter().cloned().collect::<Vec<_>>())
        .build()
        .map_err(|e| ShimError::InvalidArgument(format!("rootfs mount {}: {e}", m.source)))?;
    let parsed = libcontainer::rootfs::utils::parse_mount(&spec_mount)
        .map_err(|e| ShimError::InvalidArgument(format!("rootfs mount {}: options {:?}: {e}", m.source, m.options)))?;
    if parsed.rec_attr.is_some() {
        return Err(ShimError::InvalidArgument(format!(
            "rootfs mount {}: recursive attribute options in {:?} are not supported",
            m.source, m.options
        )));
    }
    Ok(MountOptions {
        flags: parsed.flags,
        data: parsed.data,
        // The last propagation option wins, as in runc.
        propagation: prop.last().and_then(|o| propagation(o)).unwrap_or(MsFlags::empty()),
    })
}

/// Unmounts (lazily, last first) what [`mount_rootfs`] mounted.
pub fn unmount_all(mounts: &[PathBuf]) {
    drop(detach_all(mounts));
}

/// Rootfs mounts taken out of the mount tree ([`detach_all`]) whose
/// filesystems are released when this is dropped: the release of an
/// overlay syncs its upper filesystem (the kernel's unmount of a
/// superblock writes back every dirty page of that whole filesystem,
/// seconds on a node writing a lot), so the daemon drops it on a thread
/// where nothing waits for it.
#[derive(Debug)]
pub struct Detached {
    _held: Vec<std::os::fd::OwnedFd>,
}

/// Takes `mounts` (mounted in order, so unmounted last first) out of the
/// mount tree at once (a lazy unmount: the mount point is free for
/// containerd to remove as soon as this returns) while a reference to
/// each is held, so that releasing the filesystem (and its sync) waits
/// for the returned value to be dropped. A path that is not mounted is
/// left alone.
pub fn detach_all(mounts: &[PathBuf]) -> Detached {
    use rustix::fs::{Mode, OFlags};
    let mut held = Vec::new();
    for p in mounts.iter().rev() {
        // O_PATH on the mount point resolves to the mounted filesystem's
        // root: the fd holds that mount.
        let fd = rustix::fs::open(p, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty());
        if nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH).is_ok()
            && let Ok(fd) = fd
        {
            held.push(fd);
        }
    }
    Detached { _held: held }
}

/// Bind mounts that plugins added must have a source: libcontainer fails
/// such a container with a bare "failed to prepare rootfs" from inside the
/// container's init, naming neither the mount nor its source.
///
/// # Errors
/// [`ShimError::InvalidArgument`] naming the mount and its source.
pub fn check_nri_mounts(adjust: &api::ContainerAdjustment) -> Result<()> {
    for m in &adjust.mounts {
        let bind = m.type_ == "bind" || m.options.iter().any(|o| o == "bind" || o == "rbind");
        if bind && !m.destination.starts_with('-') && !Path::new(&m.source).exists() {
            return Err(ShimError::InvalidArgument(format!(
                "NRI: mount of {} added by a plugin: bind source {:?} does not exist",
                m.destination, m.source
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_env_is_the_adjusted_container_env_with_the_exec_winning() {
        let container = ["PATH=/bin", "FROM_NRI=1", "SHARED=container"].map(String::from);
        let mut p = serde_json::json!({"env": ["SHARED=exec", "PATH=/bin", "OWN=1"]});
        merge_exec_env(&container, &mut p);
        assert_eq!(
            p["env"],
            serde_json::json!(["PATH=/bin", "FROM_NRI=1", "SHARED=exec", "OWN=1"])
        );
        let mut p = serde_json::json!({"args": ["sh"]});
        merge_exec_env(&container, &mut p);
        assert_eq!(p["env"], serde_json::json!(container));
    }

    #[test]
    fn exec_processes_get_a_path_once() {
        let mut p = serde_json::json!({"args": ["sh"]});
        default_exec_path_env(&mut p);
        assert_eq!(p["env"], serde_json::json!([DEFAULT_PATH_ENV]));
        let mut p = serde_json::json!({"env": ["A=1"]});
        default_exec_path_env(&mut p);
        default_exec_path_env(&mut p);
        assert_eq!(p["env"], serde_json::json!(["A=1", DEFAULT_PATH_ENV]));
        let mut p = serde_json::json!({"env": ["PATH=/x"]});
        default_exec_path_env(&mut p);
        assert_eq!(p["env"], serde_json::json!(["PATH=/x"]));
    }

    #[test]
    fn own_pid_namespace_only_when_new() {
        let spec = |ns: serde_json::Value| -> Spec {
            serde_json::from_value(serde_json::json!({"ociVersion": "1.0.2", "linux": {"namespaces": ns}})).unwrap()
        };
        assert!(has_own_pid_namespace(&spec(
            serde_json::json!([{"type": "pid"}, {"type": "mount"}])
        )));
        assert!(!has_own_pid_namespace(&spec(serde_json::json!([{"type": "mount"}]))));
        assert!(!has_own_pid_namespace(&spec(
            serde_json::json!([{"type": "pid", "path": "/proc/1/ns/pid"}])
        )));
        let no_linux: Spec = serde_json::from_value(serde_json::json!({"ociVersion": "1.0.2"})).unwrap();
        assert!(!has_own_pid_namespace(&no_linux));
    }

    #[test]
    fn a_spec_with_nothing_to_run_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let b = Bundle::new(dir.path());
        std::fs::write(
            b.config_path(),
            r#"{"ociVersion":"1.0.2","process":{"cwd":"/","args":[],"user":{"uid":0,"gid":0}}}"#,
        )
        .unwrap();
        let e = b.load_spec().err().unwrap();
        assert!(matches!(e, ShimError::InvalidArgument(_)), "{e}");
        assert!(e.to_string().contains("config.json: process.args is empty"), "{e}");
    }

    fn mount(options: &[&str]) -> Mount {
        Mount {
            type_: "overlay".into(),
            source: "overlay".into(),
            options: options.iter().map(|o| o.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn flag_options_are_flags_and_only_the_rest_is_filesystem_data() {
        let p = parse_options(&mount(&[
            "ro",
            "noatime",
            "nosuid",
            "nodev",
            "rprivate",
            "index=off",
            "lowerdir=/a:/b",
            "upperdir=/u",
        ]))
        .unwrap();
        assert_eq!(p.data, ["index=off", "lowerdir=/a:/b", "upperdir=/u"]);
        assert_eq!(
            p.flags,
            MsFlags::MS_RDONLY | MsFlags::MS_NOATIME | MsFlags::MS_NOSUID | MsFlags::MS_NODEV
        );
        assert_eq!(p.propagation, MsFlags::MS_PRIVATE | MsFlags::MS_REC);
        // Clearing options clear what came before them, as in runc; a
        // propagation option does not take MS_REC from rbind.
        let p = parse_options(&mount(&["ro", "rw", "nodev", "dev", "rbind", "rprivate", "shared"])).unwrap();
        assert!(p.data.is_empty(), "{:?}", p.data);
        assert_eq!(p.flags, MsFlags::MS_BIND | MsFlags::MS_REC);
        assert_eq!(p.propagation, MsFlags::MS_SHARED);
        assert!(matches!(
            parse_options(&mount(&["rro"])),
            Err(ShimError::InvalidArgument(_))
        ));
    }

    /// Needs root (as every machine of the project runs tests): a real
    /// overlay mount with a flag option among the snapshotter's options.
    /// Passed as filesystem data, `noatime` made overlayfs refuse the mount.
    #[test]
    fn an_overlay_rootfs_with_flag_options_mounts() {
        let dir = tempfile::tempdir().unwrap();
        let d = |n: &str| {
            let p = dir.path().join(n);
            std::fs::create_dir_all(&p).unwrap();
            p
        };
        let (lower, upper, work, target) = (d("lower"), d("upper"), d("work"), dir.path().join("rootfs"));
        std::fs::write(lower.join("hello"), "from lower").unwrap();
        let m = Mount {
            type_: "overlay".into(),
            source: "overlay".into(),
            options: vec![
                "index=off".into(),
                "noatime".into(),
                "nodev".into(),
                format!("lowerdir={}", lower.display()),
                format!("upperdir={}", upper.display()),
                format!("workdir={}", work.display()),
            ],
            ..Default::default()
        };
        let mounted = mount_rootfs(&[m], &target).expect("overlay mount (the test runs as root)");
        let seen = std::fs::read_to_string(target.join("hello"));
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        unmount_all(&mounted);
        assert_eq!(seen.unwrap(), "from lower");
        let line = info
            .lines()
            .find(|l| l.contains(&*target.to_string_lossy()))
            .expect("in mountinfo");
        assert!(line.contains("noatime") && line.contains("nodev"), "{line}");
    }

    #[test]
    fn uidmap_and_gidmap_options_go_together_and_leave_the_rest() {
        let (map, rest) = take_idmap(&mount(&["uidmap=0:100000:65536", "index=off", "gidmap=0:200000:65536"]))
            .unwrap()
            .unwrap();
        assert_eq!(map.uids[0].host_id(), 100000);
        assert_eq!(rest.options, ["index=off"]);
        assert!(take_idmap(&mount(&["index=off"])).unwrap().is_none());
        let e = take_idmap(&mount(&["uidmap=0:1:1"])).unwrap_err().to_string();
        assert!(
            e.contains("rootfs mount overlay (overlay)") && e.contains("go together"),
            "{e}"
        );
    }

    /// Root only. containerd's overlay snapshotter gives a user-namespaced
    /// pod's rootfs `uidmap=`/`gidmap=` (its upper directory already owned by
    /// the pod's root): the layers' 0:0 files show as the mapping's host
    /// ids, the staging directory is gone once the overlay is mounted, and
    /// a parentless snapshot's bind mount gets an idmapped clone on top.
    #[test]
    fn an_idmapped_rootfs_shows_the_layers_as_the_pods_ids() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let d = |n: &str| {
            let p = dir.path().join(n);
            std::fs::create_dir_all(&p).unwrap();
            p
        };
        let (l1, l2, upper, work) = (d("l1"), d("l2"), d("upper"), d("work"));
        let target = dir.path().join("bundle/rootfs");
        std::fs::write(l1.join("a"), "1").unwrap();
        std::fs::write(l2.join("b"), "2").unwrap();
        let idmap = ["uidmap=0:100000:65536".to_string(), "gidmap=0:200000:65536".to_string()];
        let overlay = Mount {
            type_: "overlay".into(),
            source: "overlay".into(),
            options: [
                idmap.to_vec(),
                vec![
                    "index=off".into(),
                    format!("workdir={}", work.display()),
                    format!("upperdir={}", upper.display()),
                    format!("lowerdir={}:{}", l1.display(), l2.display()),
                ],
            ]
            .concat(),
            ..Default::default()
        };
        let mounted = mount_rootfs(&[overlay], &target).expect("idmapped overlay (root, Linux 5.19+)");
        let owner = |p: PathBuf| std::fs::metadata(p).map(|m| (m.uid(), m.gid())).unwrap();
        let seen = (owner(target.join("a")), owner(target.join("b")));
        let staging_left = target.with_file_name(".nri-shim-idmap").exists();
        unmount_all(&mounted);
        assert_eq!(seen, ((100000, 200000), (100000, 200000)));
        assert!(!staging_left);

        let bind = Mount {
            type_: "bind".into(),
            source: l1.display().to_string(),
            options: [idmap.to_vec(), vec!["rbind".into(), "rw".into()]].concat(),
            ..Default::default()
        };
        let mounted = mount_rootfs(&[bind], &target).expect("idmapped bind");
        let seen = owner(target.join("a"));
        unmount_all(&mounted);
        assert_eq!((mounted.len(), seen), (2, (100000, 200000)));
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!info.contains(dir.path().to_str().unwrap()), "left mounted:\n{info}");
    }

    #[test]
    fn a_missing_or_non_directory_rootfs_is_named_with_the_errno() {
        let dir = tempfile::tempdir().unwrap();
        let spec = |root: &str| -> Spec {
            serde_json::from_value(serde_json::json!({"ociVersion": "1.0.2", "root": {"path": root}})).unwrap()
        };
        std::fs::create_dir(dir.path().join("rootfs")).unwrap();
        std::fs::write(dir.path().join("file"), "").unwrap();
        check_rootfs(dir.path(), &spec("rootfs")).unwrap();
        let e = check_rootfs(dir.path(), &spec("/nonexistent/nri-shim-rootfs")).unwrap_err();
        assert!(matches!(e, ShimError::InvalidArgument(_)), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("stat /nonexistent/nri-shim-rootfs") && text.contains("No such file or directory"),
            "{text}"
        );
        let e = check_rootfs(dir.path(), &spec("file")).unwrap_err().to_string();
        assert!(e.contains("file: not a directory"), "{e}");
    }

    #[test]
    fn a_missing_bind_source_added_by_a_plugin_is_named() {
        let mut adj = api::ContainerAdjustment::new();
        adj.mounts.push(api::Mount {
            destination: "/data".into(),
            source: "/nonexistent/nri-shim-test".into(),
            type_: "bind".into(),
            ..Default::default()
        });
        let e = check_nri_mounts(&adj).unwrap_err().to_string();
        assert!(e.contains("/data") && e.contains("/nonexistent/nri-shim-test"), "{e}");
    }
}
