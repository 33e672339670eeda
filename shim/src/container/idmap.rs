//! Idmapped mounts (Linux 5.12+, `mount_setattr(2)` with
//! `MOUNT_ATTR_IDMAP`), made by the shim on the host.
//!
//! A user-namespaced pod (Kubernetes `hostUsers: false`) runs as host ids
//! that the pod's user namespace maps to 0 and up, while the image layers
//! and volumes on disk are owned by the host's ids. Two things ask the
//! runtime to show those files through the pod's mapping instead of
//! changing their owners:
//! - containerd's overlay snapshotter (2.0+, on Linux 5.19+) leaves the
//!   layers as they are and adds `uidmap=C:H:S[,C:H:S...]` and
//!   `gidmap=...` to the rootfs mount it hands the shim;
//! - the kubelet and containerd put `uidMappings`/`gidMappings` on the
//!   pod's bind mounts (OCI runtime spec 1.2, idmapped mounts).
//!
//! An idmapped mount shows a file owned on disk by container id `C` as
//! owned by host id `H` (for `C:H:S`, `C` to `C+S-1`), which the pod's user
//! namespace maps back to `C`: the container's root sees the image's root
//! files as its own. libcontainer 0.7 makes no idmapped mounts (it refuses
//! an OCI mount with mappings), so the shim makes them here, as root in its
//! own mount namespace, and passes on a plain mount of the result: a clone
//! of an idmapped mount keeps its idmapping.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use libcontainer::syscall::Syscall;
use libcontainer::syscall::SyscallError;
use libcontainer::syscall::linux::{
    AT_EMPTY_PATH, AT_RECURSIVE, LinuxSyscall, MOUNT_ATTR_RDONLY, MOVE_MOUNT_F_EMPTY_PATH, MountAttr,
};
use oci_spec::runtime::{LinuxIdMapping, LinuxIdMappingBuilder};

use crate::error::{Result, ShimError};

/// `open_tree(2)`: clone the mount (tree) instead of opening it in place
/// (kernel uapi `OPEN_TREE_CLONE`; the libc crate has it for Android only).
const OPEN_TREE_CLONE: u32 = 1;
/// `mount_setattr(2)`: give the mount the id mapping of `userns_fd` (kernel
/// uapi `MOUNT_ATTR_IDMAP`, in neither libc nor libcontainer).
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// A uid and a gid mapping, each a list of `containerID:hostID:size` ranges
/// (`/proc/<pid>/uid_map` lines; OCI `LinuxIDMapping`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdMap {
    /// uid ranges.
    pub uids: Vec<LinuxIdMapping>,
    /// gid ranges.
    pub gids: Vec<LinuxIdMapping>,
}

impl IdMap {
    /// The two mappings, checked as the kernel will check them when they
    /// are written: at least one range each, no range of size 0, no range
    /// past `u32::MAX`.
    ///
    /// # Errors
    /// [`ShimError::InvalidArgument`] naming `what` (the mount or option)
    /// and the bad range.
    pub fn new(what: &str, uids: Vec<LinuxIdMapping>, gids: Vec<LinuxIdMapping>) -> Result<IdMap> {
        for (kind, ranges) in [("uid", &uids), ("gid", &gids)] {
            if ranges.is_empty() {
                return Err(ShimError::InvalidArgument(format!(
                    "{what}: idmapped mount without a {kind} mapping: both uid and gid mappings are needed"
                )));
            }
            for r in ranges {
                let end = |id: u32| u64::from(id) + u64::from(r.size());
                if r.size() == 0 || end(r.container_id()) > 1 << 32 || end(r.host_id()) > 1 << 32 {
                    return Err(ShimError::InvalidArgument(format!(
                        "{what}: {kind} mapping {}:{}:{} is empty or goes past {}",
                        r.container_id(),
                        r.host_id(),
                        r.size(),
                        u32::MAX
                    )));
                }
            }
        }
        Ok(IdMap { uids, gids })
    }

    /// The mapping of containerd's `uidmap=` and `gidmap=` mount options
    /// (values `C:H:S` ranges separated by `,`).
    ///
    /// # Errors
    /// [`ShimError::InvalidArgument`] naming the option when a value does
    /// not parse or only one of the two is given.
    pub fn from_options(what: &str, uidmap: &str, gidmap: &str) -> Result<IdMap> {
        let parse = |name: &str, value: &str| -> Result<Vec<LinuxIdMapping>> {
            value
                .split(',')
                .map(|range| {
                    let bad = || {
                        ShimError::InvalidArgument(format!(
                            "{what}: option {name}={value}: {range:?} is not containerID:hostID:size"
                        ))
                    };
                    let mut ids = range.split(':').map(|n| n.parse::<u32>().map_err(|_| bad()));
                    let (Some(c), Some(h), Some(s), None) = (ids.next(), ids.next(), ids.next(), ids.next()) else {
                        return Err(bad());
                    };
                    Ok(LinuxIdMappingBuilder::default()
                        .container_id(c?)
                        .host_id(h?)
                        .size(s?)
                        .build()
                        .expect("all fields set"))
                })
                .collect()
        };
        IdMap::new(what, parse("uidmap", uidmap)?, parse("gidmap", gidmap)?)
    }

    /// The map file text: one `C H S` line per range.
    fn map_file(ranges: &[LinuxIdMapping]) -> String {
        ranges
            .iter()
            .map(|r| format!("{} {} {}\n", r.container_id(), r.host_id(), r.size()))
            .collect()
    }
}

/// A user namespace holding an [`IdMap`], kept open by its file descriptor
/// (`/proc/<pid>/ns/user` of a process that has since exited): what
/// `mount_setattr(2)` takes to idmap a mount.
#[derive(Debug)]
pub struct UserNs {
    fd: OwnedFd,
}

impl UserNs {
    /// A new user namespace with `map`: a forked child unshares its user
    /// namespace and waits; this process (root in the initial namespace)
    /// writes the child's `uid_map` and `gid_map`, opens its `ns/user` and
    /// kills it. containerd's own mount code does the same with a re-exec
    /// of itself.
    ///
    /// # Errors
    /// [`ShimError::Io`] naming the step (fork, unshare, map file) and the
    /// errno; the kernel refuses maps with overlapping ranges (EINVAL).
    pub fn with_map(map: &IdMap) -> Result<UserNs> {
        let pipe = || {
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                .map_err(|e| ShimError::io("user namespace for an idmapped mount: pipe", e.into()))
        };
        let (ready_r, ready_w) = pipe()?;
        // SAFETY: the child calls only async-signal-safe functions (raw
        // unshare, write, pause and _exit: no allocation, no lock), as a
        // child of a multithreaded process must.
        let fork = unsafe { nix::unistd::fork() };
        let child = match fork {
            Err(e) => return Err(ShimError::io("user namespace for an idmapped mount: fork", e.into())),
            Ok(nix::unistd::ForkResult::Child) => unsafe {
                // 0, or the errno of the unshare.
                let errno: i32 = if libc::unshare(libc::CLONE_NEWUSER) == 0 {
                    0
                } else {
                    *libc::__errno_location()
                };
                libc::write(ready_w.as_raw_fd(), (&errno as *const i32).cast(), 4);
                loop {
                    libc::pause();
                }
            },
            Ok(nix::unistd::ForkResult::Parent { child }) => Reaped(child),
        };
        drop(ready_w);
        let mut errno = [0u8; 4];
        let unshared = match std::fs::File::from(ready_r).read_exact(&mut errno) {
            Err(e) => Err(e),
            Ok(()) if errno == [0; 4] => Ok(()),
            Ok(()) => Err(std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno))),
        };
        unshared.map_err(|e| {
            ShimError::io(
                "user namespace for an idmapped mount: unshare(CLONE_NEWUSER) in the child",
                e,
            )
        })?;
        let proc = format!("/proc/{}", child.0);
        for (file, ranges) in [("uid_map", &map.uids), ("gid_map", &map.gids)] {
            let path = format!("{proc}/{file}");
            let text = IdMap::map_file(ranges);
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|mut f| f.write_all(text.as_bytes()))
                .map_err(|e| ShimError::io(format!("write {:?} to {path}", text.trim_end()), e))?;
        }
        let ns = format!("{proc}/ns/user");
        let fd = std::fs::File::open(&ns).map_err(|e| ShimError::io(format!("open {ns}"), e))?;
        Ok(UserNs { fd: fd.into() })
    }
}

/// Kills and reaps the holder child however [`UserNs::with_map`] ends.
struct Reaped(nix::unistd::Pid);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(self.0, None);
    }
}

/// The errno of a libcontainer syscall wrapper's error.
fn os_error(e: SyscallError) -> std::io::Error {
    match e {
        SyscallError::Nix(errno) => errno.into(),
        SyscallError::IO(e) => e,
        other => std::io::Error::other(other.to_string()),
    }
}

/// A detached clone of the mount at `source` (with its submounts when
/// `recursive`, as `rbind` takes them), idmapped by `userns` and read-only
/// when `read_only`: attach it with [`attach`].
///
/// # Errors
/// As [`clone_tree`] and [`set_idmap`].
pub fn idmapped_clone(source: &Path, userns: &UserNs, recursive: bool, read_only: bool) -> Result<OwnedFd> {
    let tree = clone_tree(source, recursive)?;
    set_idmap(&tree, source, userns, recursive, read_only)?;
    Ok(tree)
}

/// A detached clone of the mount at `source` (`open_tree(2)` with
/// `OPEN_TREE_CLONE`), with its submounts when `recursive`.
///
/// # Errors
/// [`ShimError::Io`] naming the source.
pub fn clone_tree(source: &Path, recursive: bool) -> Result<OwnedFd> {
    let src = source
        .to_str()
        .ok_or_else(|| ShimError::InvalidArgument(format!("idmapped mount source {source:?} is not UTF-8")))?;
    let mut flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as u32;
    if recursive {
        flags |= AT_RECURSIVE;
    }
    LinuxSyscall
        .open_tree(libc::AT_FDCWD, Some(src), flags)
        .map_err(|e| ShimError::io(format!("open_tree {src} (idmapped mount)"), os_error(e)))
}

/// Idmaps the detached `tree` (a clone of `source`, named in errors) by
/// `userns`, its submounts too when `recursive`; read-only when
/// `read_only`.
///
/// # Errors
/// [`ShimError::Io`] naming the source; EINVAL when its filesystem cannot
/// be idmapped.
pub fn set_idmap(tree: &OwnedFd, source: &Path, userns: &UserNs, recursive: bool, read_only: bool) -> Result<()> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | if read_only { MOUNT_ATTR_RDONLY } else { 0 },
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.fd.as_raw_fd() as u64,
    };
    let mut at = AT_EMPTY_PATH;
    if recursive {
        at |= AT_RECURSIVE;
    }
    LinuxSyscall
        .mount_setattr(tree.as_fd(), Path::new(""), at, &attr, std::mem::size_of::<MountAttr>())
        .map_err(|e| {
            ShimError::io(
                format!("mount_setattr MOUNT_ATTR_IDMAP on {}", source.display()),
                os_error(e),
            )
        })
}

/// Mounts the detached `tree` ([`idmapped_clone`]) on `target`, which
/// must exist (a directory, or a file for a file's mount).
///
/// # Errors
/// [`ShimError::Io`] naming the target.
pub fn attach(tree: OwnedFd, target: &Path) -> Result<()> {
    let to = target
        .to_str()
        .ok_or_else(|| ShimError::InvalidArgument(format!("idmapped mount target {target:?} is not UTF-8")))?;
    LinuxSyscall
        .move_mount(tree.as_fd(), None, rustix::fs::CWD, Some(to), MOVE_MOUNT_F_EMPTY_PATH)
        .map_err(|e| ShimError::io(format!("move_mount idmapped mount to {to}"), os_error(e)))
}

/// Directory of the bundle where the idmapped bind mounts of a container's
/// spec are staged ([`stage_spec_mounts`]): `<bundle>/nri-shim-mounts/<n>`.
pub const STAGED_MOUNTS_DIR: &str = "nri-shim-mounts";

/// Does the mount ask for an idmapping (OCI `uidMappings`/`gidMappings`,
/// or the `idmap`/`ridmap` option)?
fn wants_idmap(m: &oci_spec::runtime::Mount) -> bool {
    m.uid_mappings().as_ref().is_some_and(|v| !v.is_empty())
        || m.gid_mappings().as_ref().is_some_and(|v| !v.is_empty())
        || m.options()
            .as_ref()
            .is_some_and(|o| o.iter().any(|o| o == "idmap" || o == "ridmap"))
}

/// Is it a bind mount (type `bind`, or option `bind` or `rbind`)?
fn is_bind(m: &oci_spec::runtime::Mount) -> bool {
    m.typ().as_deref() == Some("bind")
        || m.options()
            .as_ref()
            .is_some_and(|o| o.iter().any(|o| o == "bind" || o == "rbind"))
}

/// Does the spec give the container a user namespace?
fn has_user_namespace(spec: &oci_spec::runtime::Spec) -> bool {
    spec.linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .is_some_and(|ns| {
            ns.iter()
                .any(|n| n.typ() == oci_spec::runtime::LinuxNamespaceType::User)
        })
}

/// Is the mount one [`stage_spec_mounts`] stages in a container with (or
/// without) a user namespace?
fn is_staged(m: &oci_spec::runtime::Mount, userns: bool) -> bool {
    wants_idmap(m) || (userns && is_bind(m))
}

/// The process's uid and gid must have a host id in the container's user
/// namespace (`linux.uidMappings`/`gidMappings`): libcontainer sets them
/// after joining it and fails with a bare EINVAL ("intermediate process
/// error") when they have none. A spec without mappings (no user
/// namespace, or one joined by path without them) is not checked.
///
/// # Errors
/// [`ShimError::InvalidArgument`] naming the id and the mappings.
pub fn check_process_ids_mapped(spec: &oci_spec::runtime::Spec) -> Result<()> {
    let (Some(linux), Some(process)) = (spec.linux().as_ref(), spec.process().as_ref()) else {
        return Ok(());
    };
    let user = process.user();
    for (kind, id, ranges) in [
        ("uid", user.uid(), linux.uid_mappings()),
        ("gid", user.gid(), linux.gid_mappings()),
    ] {
        let Some(ranges) = ranges.as_ref().filter(|r| !r.is_empty()) else {
            continue;
        };
        let covered = ranges
            .iter()
            .any(|r| id >= r.container_id() && u64::from(id) < u64::from(r.container_id()) + u64::from(r.size()));
        if !covered {
            let shown: Vec<String> = ranges
                .iter()
                .map(|r| format!("{}:{}:{}", r.container_id(), r.host_id(), r.size()))
                .collect();
            return Err(ShimError::InvalidArgument(format!(
                "process.user.{kind} {id} has no host id in the container's user namespace \
                 (linux.{kind}Mappings, containerID:hostID:size: {})",
                shown.join(", ")
            )));
        }
    }
    Ok(())
}

/// Does `spec` have a mount [`stage_spec_mounts`] stages?
pub fn wants_staging(spec: &oci_spec::runtime::Spec) -> bool {
    let userns = has_user_namespace(spec);
    spec.mounts()
        .as_ref()
        .is_some_and(|m| m.iter().any(|m| is_staged(m, userns)))
}

/// Makes the idmapped bind mounts of `spec` (OCI runtime spec 1.2:
/// `uidMappings`/`gidMappings` on a `bind` mount; `ridmap` idmaps its
/// submounts too; `idmap`/`ridmap` without mappings take the container's
/// `linux.uidMappings`/`gidMappings`) on the host, each on
/// `<bundle>/nri-shim-mounts/<n>`, and points the spec's mount there as a
/// plain bind mount, for libcontainer (which refuses idmapped mounts) to
/// bind as any other. In a container with a user namespace every other
/// bind mount is staged there too, without an idmap: libcontainer opens a
/// bind mount's source from inside the container's user namespace, where
/// a source under a directory only the host's root may enter (containerd's
/// sandbox `/dev/shm` and `resolv.conf`, say) cannot be reached, while the
/// bundle can (containerd gives its group to the container's root).
/// Returns the staged paths, to unmount with the rootfs
/// ([`super::bundle::unmount_all`]); on error nothing stays mounted.
///
/// # Errors
/// [`ShimError::InvalidArgument`] naming the mount's destination for an
/// idmapped mount that is not a bind mount, or has mappings that do not
/// parse (see [`IdMap::new`]); [`ShimError::Io`] from the mount calls,
/// naming the source (EINVAL when its filesystem cannot be idmapped).
pub fn stage_spec_mounts(spec: &mut oci_spec::runtime::Spec, bundle: &Path) -> Result<Vec<std::path::PathBuf>> {
    let userns = has_user_namespace(spec);
    let Some(mut mounts) = spec.mounts().clone().filter(|m| m.iter().any(|m| is_staged(m, userns))) else {
        return Ok(Vec::new());
    };
    let linux = spec.linux().as_ref();
    let spec_map = (
        linux.and_then(|l| l.uid_mappings().clone()).unwrap_or_default(),
        linux.and_then(|l| l.gid_mappings().clone()).unwrap_or_default(),
    );
    let dir = bundle.join(STAGED_MOUNTS_DIR);
    let mut staged = Staged(Vec::new(), dir.clone());
    let mut namespaces: Vec<(IdMap, UserNs)> = Vec::new();
    for (n, m) in mounts.iter_mut().enumerate().filter(|(_, m)| is_staged(m, userns)) {
        let what = format!("mount {}", m.destination().display());
        let options = m.options().clone().unwrap_or_default();
        let has = |o: &str| options.iter().any(|x| x == o);
        if !is_bind(m) {
            return Err(ShimError::InvalidArgument(format!(
                "{what}: idmapped mounts must be bind mounts (type {:?})",
                m.typ().as_deref().unwrap_or("")
            )));
        }
        let source = m
            .source()
            .clone()
            .ok_or_else(|| ShimError::InvalidArgument(format!("{what}: bind mount without a source")))?;
        let tree = clone_tree(&source, has("rbind"))?;
        if wants_idmap(m) {
            let ns = idmap_namespace(m, &what, &spec_map, &mut namespaces)?;
            set_idmap(&tree, &source, ns, has("ridmap"), false)?;
        }
        if staged.0.is_empty() {
            // The container's init binds these from inside its user
            // namespace: its root must pass through.
            make_dir(&dir, crate::private::TRAVERSE_MODE)?;
        }
        let at = dir.join(n.to_string());
        let is_dir = std::fs::metadata(&source)
            .map_err(|e| ShimError::io(format!("{what}: stat {}", source.display()), e))?
            .is_dir();
        if is_dir {
            make_dir(&at, crate::private::DIR_MODE)?;
        } else {
            crate::private::create(&at).map_err(|e| ShimError::io(format!("create {}", at.display()), e))?;
        }
        staged.0.push(at.clone());
        attach(tree, &at)?;
        m.set_source(Some(at));
        m.set_uid_mappings(None);
        m.set_gid_mappings(None);
        m.set_options(Some(
            options.into_iter().filter(|o| o != "idmap" && o != "ridmap").collect(),
        ));
    }
    spec.set_mounts(Some(mounts));
    Ok(std::mem::take(&mut staged.0))
}

/// The user namespace holding the mapping of idmapped mount `m` (named
/// `what`): its own mappings, or the container's (`spec_map`) for `idmap`
/// or `ridmap` without any; one per distinct mapping in `namespaces`.
fn idmap_namespace<'a>(
    m: &oci_spec::runtime::Mount,
    what: &str,
    spec_map: &(Vec<LinuxIdMapping>, Vec<LinuxIdMapping>),
    namespaces: &'a mut Vec<(IdMap, UserNs)>,
) -> Result<&'a UserNs> {
    let (uids, gids) = match (m.uid_mappings().clone(), m.gid_mappings().clone()) {
        (None, None) if spec_map.0.is_empty() => {
            return Err(ShimError::InvalidArgument(format!(
                "{what}: option idmap or ridmap without uidMappings and gidMappings takes the \
                     container's user namespace mappings, and the container has none"
            )));
        }
        (None, None) => spec_map.clone(),
        (u, g) => (u.unwrap_or_default(), g.unwrap_or_default()),
    };
    let map = IdMap::new(what, uids, gids)?;
    let i = match namespaces.iter().position(|(m, _)| *m == map) {
        Some(i) => i,
        None => {
            let ns = UserNs::with_map(&map)?;
            namespaces.push((map, ns));
            namespaces.len() - 1
        }
    };
    Ok(&namespaces[i].1)
}

fn make_dir(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(mode).create(path) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            Err(ShimError::io(format!("create {}", path.display()), e))
        }
        _ => Ok(()),
    }
}

/// Mounts staged so far (`.0`), and their directory (`.1`): unstaged
/// ([`unstage`]) when dropped; take the list out to keep them.
pub(crate) struct Staged(pub(crate) Vec<std::path::PathBuf>, pub(crate) std::path::PathBuf);

impl Drop for Staged {
    fn drop(&mut self) {
        unstage(&self.0, &self.1);
    }
}

/// Detaches the staged mounts and removes their mount points and
/// directory, never recursively: a still-mounted point (EBUSY) keeps its
/// volume's files.
pub fn unstage(mounts: &[std::path::PathBuf], dir: &Path) {
    for at in mounts {
        let _ = nix::mount::umount2(at, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir(at).or_else(|_| std::fs::remove_file(at));
    }
    let _ = std::fs::remove_dir(dir);
}

/// After a daemon restart or in `delete` without the daemon: detaches and
/// removes whatever is left under the bundle's [`STAGED_MOUNTS_DIR`].
pub fn unstage_all(bundle: &Path) {
    let dir = bundle.join(STAGED_MOUNTS_DIR);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    let mounts: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    unstage(&mounts, &dir);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn range(c: u32, h: u32, s: u32) -> LinuxIdMapping {
        LinuxIdMappingBuilder::default()
            .container_id(c)
            .host_id(h)
            .size(s)
            .build()
            .unwrap()
    }

    #[test]
    fn containerd_options_parse_and_bad_ones_are_named() {
        let m = IdMap::from_options("rootfs", "0:100000:65536", "0:200000:1,1:300000:10").unwrap();
        assert_eq!(m.uids, vec![range(0, 100000, 65536)]);
        assert_eq!(m.gids, vec![range(0, 200000, 1), range(1, 300000, 10)]);
        assert_eq!(IdMap::map_file(&m.gids), "0 200000 1\n1 300000 10\n");
        for (u, g, needle) in [
            ("0:1", "0:1:1", "uidmap=0:1: \"0:1\""),
            ("0:1:1:1", "0:1:1", "uidmap=0:1:1:1"),
            ("0:1:1", "x:1:1", "gidmap=x:1:1"),
            ("0:1:0", "0:1:1", "uid mapping 0:1:0 is empty"),
            ("0:4294967295:2", "0:1:1", "uid mapping 0:4294967295:2"),
        ] {
            let e = IdMap::from_options("rootfs", u, g).unwrap_err().to_string();
            assert!(e.contains("rootfs") && e.contains(needle), "{e}");
        }
        let e = IdMap::new("volume /v", vec![range(0, 1, 1)], vec![])
            .unwrap_err()
            .to_string();
        assert!(e.contains("volume /v") && e.contains("without a gid mapping"), "{e}");
    }

    /// Root only (as the test command runs): a file owned by 0:0 on disk
    /// shows as the mapping's host ids through the idmapped mount, a file
    /// created through it is stored as the container ids, and a read-only
    /// clone refuses writes. Nothing is left mounted.
    #[test]
    fn an_idmapped_clone_shows_disk_ids_as_host_ids() {
        let dir = tempfile::tempdir().unwrap();
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        std::fs::create_dir_all(&src).unwrap();
        std::fs::create_dir_all(&dst).unwrap();
        std::fs::write(src.join("f"), "x").unwrap();
        std::os::unix::fs::chown(src.join("f"), Some(0), Some(0)).unwrap();
        let map = IdMap::new("test", vec![range(0, 100000, 65536)], vec![range(0, 200000, 65536)]).unwrap();
        let userns = UserNs::with_map(&map).unwrap();
        attach(idmapped_clone(&src, &userns, false, false).unwrap(), &dst).unwrap();
        let seen = std::fs::metadata(dst.join("f")).map(|m| (m.uid(), m.gid()));
        // Host ids 100005:200007 given through the mount are 5:7 on disk.
        std::fs::write(src.join("g"), "y").unwrap();
        let made = std::os::unix::fs::chown(dst.join("g"), Some(100005), Some(200007))
            .and_then(|()| std::fs::metadata(src.join("g")).map(|m| (m.uid(), m.gid())));
        nix::mount::umount2(&dst, nix::mount::MntFlags::MNT_DETACH).unwrap();
        assert_eq!(seen.unwrap(), (100000, 200000));
        assert_eq!(made.unwrap(), (5, 7));

        attach(idmapped_clone(&src, &userns, false, true).unwrap(), &dst).unwrap();
        let write = std::fs::write(dst.join("h"), "z");
        nix::mount::umount2(&dst, nix::mount::MntFlags::MNT_DETACH).unwrap();
        assert_eq!(write.unwrap_err().raw_os_error(), Some(libc::EROFS));
        assert!(
            !std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .contains(dir.path().to_str().unwrap())
        );
    }

    /// Root only. A user-namespaced container's bind mounts are staged in
    /// the bundle: the one with mappings idmapped (its 0:0 file shows as
    /// the host ids), the one without as a plain clone; the spec points at
    /// them without mappings or `idmap`; a mount without a source leaves
    /// nothing staged; [`unstage_all`] leaves nothing mounted.
    #[test]
    fn bind_mounts_of_a_user_namespaced_container_are_staged_in_the_bundle() {
        let dir = tempfile::tempdir().unwrap();
        let (vol, file, bundle) = (
            dir.path().join("vol"),
            dir.path().join("file"),
            dir.path().join("bundle"),
        );
        std::fs::create_dir_all(&vol).unwrap();
        std::fs::create_dir_all(&bundle).unwrap();
        std::fs::write(vol.join("f"), "x").unwrap();
        std::fs::write(&file, "y").unwrap();
        let spec = |extra: serde_json::Value| -> oci_spec::runtime::Spec {
            let mut mounts = vec![
                serde_json::json!({"destination": "/proc", "type": "proc", "source": "proc"}),
                serde_json::json!({"destination": "/v", "type": "bind", "source": vol, "options": ["rbind", "idmap"],
                    "uidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}],
                    "gidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}]}),
                serde_json::json!({"destination": "/etc/hostname", "type": "bind", "source": file, "options": ["rbind", "ro"]}),
            ];
            mounts.push(extra);
            serde_json::from_value(serde_json::json!({
                "ociVersion": "1.2.0",
                "mounts": mounts,
                "linux": {"namespaces": [{"type": "user"}, {"type": "mount"}],
                    "uidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}],
                    "gidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}]}
            }))
            .unwrap()
        };
        let mut s = spec(serde_json::json!({"destination": "/x", "type": "tmpfs", "source": "tmpfs"}));
        assert!(wants_staging(&s));
        let staged = stage_spec_mounts(&mut s, &bundle).unwrap();
        let mounts = s.mounts().clone().unwrap();
        let staged_dir = bundle.join(STAGED_MOUNTS_DIR);
        assert_eq!(staged, vec![staged_dir.join("1"), staged_dir.join("2")]);
        assert_eq!(mounts[0].source().as_deref(), Some(Path::new("proc")));
        assert_eq!(mounts[1].source().as_deref(), Some(staged_dir.join("1").as_path()));
        assert!(mounts[1].uid_mappings().is_none() && mounts[1].gid_mappings().is_none());
        assert_eq!(mounts[1].options().as_deref(), Some(&["rbind".to_string()][..]));
        assert_eq!(mounts[2].source().as_deref(), Some(staged_dir.join("2").as_path()));
        let owner = std::fs::metadata(staged_dir.join("1/f")).map(|m| (m.uid(), m.gid()));
        let plain = std::fs::read_to_string(staged_dir.join("2"));
        unstage_all(&bundle);
        assert_eq!(owner.unwrap(), (100000, 100000));
        assert_eq!(plain.unwrap(), "y");
        assert!(!staged_dir.exists());

        let mut s = spec(
            serde_json::json!({"destination": "/gone", "type": "bind", "source": dir.path().join("gone"), "options": ["rbind"]}),
        );
        let e = stage_spec_mounts(&mut s, &bundle).unwrap_err().to_string();
        assert!(e.contains(&dir.path().join("gone").display().to_string()), "{e}");
        assert!(!staged_dir.exists());
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!info.contains(dir.path().to_str().unwrap()), "left mounted:\n{info}");
    }

    #[test]
    fn a_process_id_without_a_host_id_is_named() {
        let spec = |uid: u32, maps: serde_json::Value| -> oci_spec::runtime::Spec {
            serde_json::from_value(serde_json::json!({
                "ociVersion": "1.2.0",
                "process": {"user": {"uid": uid, "gid": 0}, "cwd": "/"},
                "linux": {"uidMappings": maps, "gidMappings": [{"containerID": 0, "hostID": 5, "size": 1}]}
            }))
            .unwrap()
        };
        let one = serde_json::json!([{"containerID": 1, "hostID": 196608, "size": 65536}]);
        let e = check_process_ids_mapped(&spec(0, one.clone())).unwrap_err().to_string();
        assert!(
            e.contains("process.user.uid 0 has no host id")
                && e.contains("linux.uidMappings")
                && e.contains("1:196608:65536"),
            "{e}"
        );
        check_process_ids_mapped(&spec(65536, one.clone())).unwrap();
        assert!(check_process_ids_mapped(&spec(65537, one)).is_err());
        check_process_ids_mapped(&spec(7, serde_json::json!([]))).unwrap();
    }

    #[test]
    fn overlapping_ranges_are_refused_by_the_kernel_with_the_file_named() {
        let map = IdMap::new(
            "test",
            vec![range(0, 100000, 10), range(5, 300000, 10)],
            vec![range(0, 100000, 1)],
        )
        .unwrap();
        let e = UserNs::with_map(&map).unwrap_err().to_string();
        assert!(e.contains("uid_map") && e.contains("0 100000 10"), "{e}");
    }
}
