//! The merged edits of the requested CDI devices and their application to
//! an OCI spec.
//!
//! Edits of several devices are merged first, so that two devices that
//! want different things at one place (an env name, a device node path, a
//! mount destination) are refused naming both, instead of the later one
//! silently winning. Identical edits (a spec file's common edits, the same
//! device requested twice) are applied once. Applying is idempotent: a
//! device injected a second time (e.g. by containerd and again by the shim)
//! changes nothing.

use std::{os::unix::fs::MetadataExt, path::PathBuf};

use oci_spec::runtime::{
    Hook as OciHook, Hooks, LinuxBuilder, LinuxDevice, LinuxDeviceCgroup, LinuxDeviceType, Mount as OciMount, Process,
    Spec,
};

use super::{
    CdiError,
    spec::{ContainerEdits, DeviceNode, Hook, Mount},
};

/// Where an edit came from, for error messages: a device and its file.
#[derive(Debug, Clone)]
pub(super) struct Origin {
    /// `vendor.com/class=name`, or the kind for a file's common edits.
    pub what: String,
    /// The spec file.
    pub file: PathBuf,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.what, self.file.display())
    }
}

/// A device node with everything filled in from the host.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    path: String,
    typ: LinuxDeviceType,
    major: i64,
    minor: i64,
    file_mode: Option<u32>,
    access: String,
    uid: Option<u32>,
    gid: Option<u32>,
}

/// The edits of all requested devices, conflict-checked.
#[derive(Debug, Default)]
pub(super) struct Merged {
    env: Vec<(String, String, Origin)>,
    nodes: Vec<(Node, Origin)>,
    hooks: Vec<Hook>,
    mounts: Vec<(Mount, Origin)>,
    gids: Vec<u32>,
}

fn conflict(what: String, first: &Origin, second: &Origin) -> CdiError {
    CdiError::Conflict {
        what,
        first: first.to_string(),
        second: second.to_string(),
    }
}

impl Merged {
    /// Adds `edits` of `origin`.
    ///
    /// # Errors
    /// [`CdiError::Conflict`] against an earlier edit, [`CdiError::HostDevice`]
    /// when a device node's missing details cannot be read from the host.
    pub fn add(&mut self, edits: &ContainerEdits, origin: &Origin) -> Result<(), CdiError> {
        for e in &edits.env {
            let (name, value) = e.split_once('=').unwrap_or((e, ""));
            match self.env.iter().find(|(n, _, _)| n == name) {
                Some((_, v, _)) if v == value => {}
                Some((_, _, first)) => return Err(conflict(format!("env {name}"), first, origin)),
                None => self.env.push((name.into(), value.into(), origin.clone())),
            }
        }
        for d in &edits.device_nodes {
            let node = fill(d, origin)?;
            match self.nodes.iter().find(|(n, _)| n.path == node.path) {
                Some((n, _)) if *n == node => {}
                Some((_, first)) => return Err(conflict(format!("device node {}", node.path), first, origin)),
                None => self.nodes.push((node, origin.clone())),
            }
        }
        for h in &edits.hooks {
            if !self.hooks.contains(h) {
                self.hooks.push(h.clone());
            }
        }
        for m in &edits.mounts {
            match self.mounts.iter().find(|(x, _)| x.container_path == m.container_path) {
                Some((x, _)) if x == m => {}
                Some((_, first)) => return Err(conflict(format!("mount {}", m.container_path), first, origin)),
                None => self.mounts.push((m.clone(), origin.clone())),
            }
        }
        for g in &edits.additional_gids {
            if *g != 0 && !self.gids.contains(g) {
                self.gids.push(*g);
            }
        }
        Ok(())
    }

    /// Applies the merged edits to `spec`: env by name, device nodes by
    /// path (with a cgroup allow rule for block and character devices),
    /// mounts by destination (then ordered by depth, stable), hooks and
    /// groups appended unless already there.
    pub fn apply(&self, spec: &mut Spec) {
        let process = spec.process_mut().get_or_insert_with(Process::default);
        if !self.env.is_empty() {
            let mut env = process.env().clone().unwrap_or_default();
            for (name, value, _) in &self.env {
                let entry = format!("{name}={value}");
                match env
                    .iter_mut()
                    .find(|e| e.split_once('=').map_or(e.as_str(), |(n, _)| n) == name)
                {
                    Some(e) => *e = entry,
                    None => env.push(entry),
                }
            }
            process.set_env(Some(env));
        }
        let (uid, gid) = (process.user().uid(), process.user().gid());
        if !self.gids.is_empty() {
            let user = process.user_mut();
            let mut gids = user.additional_gids().clone().unwrap_or_default();
            for g in &self.gids {
                if !gids.contains(g) {
                    gids.push(*g);
                }
            }
            user.set_additional_gids(Some(gids));
        }
        if !self.nodes.is_empty() {
            let linux = spec
                .linux_mut()
                .get_or_insert_with(|| LinuxBuilder::default().build().expect("empty linux section"));
            let mut devices = linux.devices().clone().unwrap_or_default();
            let mut resources = linux.resources().clone().unwrap_or_default();
            let mut rules = resources.devices().clone().unwrap_or_default();
            for (n, _) in &self.nodes {
                let mut dev = LinuxDevice::default();
                dev.set_path(PathBuf::from(&n.path));
                dev.set_typ(n.typ);
                dev.set_major(n.major);
                dev.set_minor(n.minor);
                dev.set_file_mode(n.file_mode);
                // A non-root process must be able to open its device.
                dev.set_uid(n.uid.or((uid > 0).then_some(uid)));
                dev.set_gid(n.gid.or((gid > 0).then_some(gid)));
                devices.retain(|d| d.path() != dev.path());
                devices.push(dev);
                if n.typ != LinuxDeviceType::P {
                    let mut rule = LinuxDeviceCgroup::default();
                    rule.set_allow(true);
                    rule.set_typ(Some(n.typ));
                    rule.set_major(Some(n.major));
                    rule.set_minor(Some(n.minor));
                    rule.set_access(Some(n.access.clone()));
                    if !rules.contains(&rule) {
                        rules.push(rule);
                    }
                }
            }
            resources.set_devices(Some(rules));
            linux.set_devices(Some(devices));
            linux.set_resources(Some(resources));
        }
        if !self.mounts.is_empty() {
            let mut mounts = spec.mounts().clone().unwrap_or_default();
            for (m, _) in &self.mounts {
                let dest = PathBuf::from(&m.container_path);
                mounts.retain(|x| x.destination() != &dest);
                let mut om = OciMount::default();
                om.set_destination(dest);
                om.set_source(Some(PathBuf::from(&m.host_path)));
                om.set_typ(m.typ.clone());
                om.set_options((!m.options.is_empty()).then(|| m.options.clone()));
                mounts.push(om);
            }
            // Parents before children: a mount must not be hidden by one
            // made later on a shorter path.
            mounts.sort_by_key(|m| m.destination().components().count());
            spec.set_mounts(Some(mounts));
        }
        if !self.hooks.is_empty() {
            let hooks = spec.hooks_mut().get_or_insert_with(Hooks::default);
            for h in &self.hooks {
                let mut oh = OciHook::default();
                oh.set_path(PathBuf::from(&h.path));
                oh.set_args((!h.args.is_empty()).then(|| h.args.clone()));
                oh.set_env((!h.env.is_empty()).then(|| h.env.clone()));
                oh.set_timeout(h.timeout);
                // Hook names were checked against OCI_HOOKS when the spec
                // was read.
                #[allow(deprecated)]
                let list = match h.hook_name.as_str() {
                    "prestart" => hooks.prestart_mut(),
                    "createRuntime" => hooks.create_runtime_mut(),
                    "createContainer" => hooks.create_container_mut(),
                    "startContainer" => hooks.start_container_mut(),
                    "poststart" => hooks.poststart_mut(),
                    _ => hooks.poststop_mut(),
                }
                .get_or_insert_with(Vec::new);
                if !list.contains(&oh) {
                    list.push(oh);
                }
            }
        }
    }
}

/// Completes a device node from its host path where the spec leaves type,
/// numbers or mode out (CDI's rule: a node with a type and, unless a FIFO,
/// a major number is taken as written).
fn fill(d: &DeviceNode, origin: &Origin) -> Result<Node, CdiError> {
    let host = d.host_path.clone().unwrap_or_else(|| d.path.clone());
    let access = d.permissions.clone().unwrap_or_else(|| "rwm".into());
    let typ = d.typ.as_deref().map(|t| match t {
        "b" => LinuxDeviceType::B,
        "u" => LinuxDeviceType::U,
        "p" => LinuxDeviceType::P,
        _ => LinuxDeviceType::C,
    });
    let complete = typ.is_some_and(|t| t == LinuxDeviceType::P || d.major.is_some_and(|m| m != 0));
    if let (true, Some(typ)) = (complete, typ) {
        return Ok(Node {
            path: d.path.clone(),
            typ,
            major: d.major.unwrap_or(0),
            minor: d.minor.unwrap_or(0),
            file_mode: d.file_mode,
            access,
            uid: d.uid,
            gid: d.gid,
        });
    }
    let host_error = |reason: String| CdiError::HostDevice {
        device: origin.to_string(),
        path: PathBuf::from(&host),
        reason,
    };
    let meta = std::fs::metadata(&host).map_err(|e| host_error(e.to_string()))?;
    let fmt = meta.mode() & libc::S_IFMT;
    let host_typ = match fmt {
        libc::S_IFCHR => LinuxDeviceType::C,
        libc::S_IFBLK => LinuxDeviceType::B,
        libc::S_IFIFO => LinuxDeviceType::P,
        _ => return Err(host_error("not a device node".into())),
    };
    if let Some(t) = typ
        && !(t == host_typ || (t == LinuxDeviceType::U && host_typ == LinuxDeviceType::C))
    {
        return Err(host_error(format!(
            "the spec says type {:?}, the host node is {:?}",
            t.as_str(),
            host_typ.as_str()
        )));
    }
    let rdev = meta.rdev();
    Ok(Node {
        path: d.path.clone(),
        typ: typ.unwrap_or(host_typ),
        major: d.major.filter(|m| *m != 0).unwrap_or(libc::major(rdev) as i64),
        minor: d.minor.unwrap_or(libc::minor(rdev) as i64),
        file_mode: d.file_mode.or(Some(meta.mode() & 0o7777)),
        access,
        uid: d.uid,
        gid: d.gid,
    })
}
