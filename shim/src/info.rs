//! `-info`: what the shim tells containerd about the runtime behind it.
//!
//! containerd 2.x runs `<shim> -info` (the runtime options of the handler,
//! a protobuf `Any`, on stdin) and reads one `containerd.types.RuntimeInfo`
//! protobuf from stdout: `name`, `version`, the `options` it was given, and
//! `features`, an `Any` whose type URL is [`FEATURES_TYPE_URL`] and whose
//! value is the OCI runtime-spec "features" document as JSON (the format of
//! `runc features`). CRI derives the handler's recursive read-only mount
//! support (mount option `rro`) and user namespace support (namespace
//! `user` and `linux.mountExtensions.idmap.enabled`) from it.
//!
//! Every feature listed is one this shim applies (through libcontainer,
//! or itself for idmapped mounts: see `container::idmap`); options that
//! need a kernel facility (the recursive `r*` mount options and idmapped
//! mounts need `mount_setattr(2)`, Linux 5.12) are listed only when the
//! running kernel has it (the time namespace, with `linux.timeOffsets`, as
//! runc 1.5 lists it: `shim/tests/runc_parity.rs` runs one beside runc).
//! Not listed: SELinux process labels (libcontainer
//! applies mount labels only), the systemd cgroup driver of a user
//! manager (`systemdUser`). The system manager's driver (`systemd`) is
//! listed as runc lists it, whatever the host: a task asking for it on a
//! host without systemd or on cgroup v1 is refused at create.

use std::path::Path;

use containerd_shim_protos::{
    protobuf::{Message as _, MessageField, well_known_types::any::Any},
    types::introspection::{RuntimeInfo, RuntimeVersion},
};
use oci_spec::runtime::{Arch, Features as OciFeatures, LinuxNamespaceType, LinuxSeccompAction, LinuxSeccompOperator};

/// The type URL containerd registers the runtime-spec `Features` JSON under.
pub const FEATURES_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/features/Features";

/// The runtime name `-info` reports: the shim's runtime type.
pub const RUNTIME_NAME: &str = "io.containerd.nri-shim.v2";

/// Why `-info` could not answer.
#[derive(Debug, thiserror::Error)]
pub enum InfoError {
    /// The runtime options on stdin are not a protobuf `Any`.
    #[error("runtime options on stdin are not a protobuf Any ({len} bytes)")]
    Options {
        /// Bytes read.
        len: usize,
        /// The decoding error.
        #[source]
        source: protobuf::Error,
    },
    /// The features document could not be serialised.
    #[error("serialise the runtime features")]
    Features(#[source] serde_json::Error),
    /// The reply could not be serialised.
    #[error("serialise RuntimeInfo")]
    Encode(#[source] protobuf::Error),
}

/// Mount options libcontainer applies through `mount(2)` flags.
const MOUNT_FLAG_OPTIONS: [&str; 33] = [
    "async",
    "atime",
    "bind",
    "defaults",
    "dev",
    "diratime",
    "dirsync",
    "exec",
    "mand",
    "noatime",
    "nodev",
    "nodiratime",
    "noexec",
    "nomand",
    "norelatime",
    "nostrictatime",
    "nosuid",
    "private",
    "rbind",
    "relatime",
    "remount",
    "ro",
    "rprivate",
    "rshared",
    "rslave",
    "runbindable",
    "rw",
    "shared",
    "slave",
    "strictatime",
    "suid",
    "sync",
    "unbindable",
];

/// Mount options libcontainer applies recursively through
/// `mount_setattr(2)` with `AT_RECURSIVE`.
const RECURSIVE_MOUNT_OPTIONS: [&str; 18] = [
    "ratime",
    "rdev",
    "rdiratime",
    "rexec",
    "rnoatime",
    "rnodev",
    "rnodiratime",
    "rnoexec",
    "rnorelatime",
    "rnostrictatime",
    "rnosuid",
    "rnosymfollow",
    "rrelatime",
    "rro",
    "rrw",
    "rstrictatime",
    "rsuid",
    "rsymfollow",
];

/// Namespaces containers get through this shim (each one exercised by its
/// tests, `time` beside runc in `runc_parity.rs`). containerd 2.x's CRI reports a handler as
/// able to run user-namespaced pods when `user` is listed and idmapped
/// mounts are enabled.
const NAMESPACES: [LinuxNamespaceType; 8] = [
    LinuxNamespaceType::Cgroup,
    LinuxNamespaceType::Ipc,
    LinuxNamespaceType::Mount,
    LinuxNamespaceType::Network,
    LinuxNamespaceType::Pid,
    LinuxNamespaceType::Time,
    LinuxNamespaceType::User,
    LinuxNamespaceType::Uts,
];

/// The OCI options that idmap a bind mount (with the container's
/// mappings when the mount has none), made by `container::idmap`.
const IDMAP_MOUNT_OPTIONS: [&str; 2] = ["idmap", "ridmap"];

/// Seccomp actions libcontainer translates for libseccomp.
const SECCOMP_ACTIONS: [LinuxSeccompAction; 9] = [
    LinuxSeccompAction::ScmpActAllow,
    LinuxSeccompAction::ScmpActErrno,
    LinuxSeccompAction::ScmpActKill,
    LinuxSeccompAction::ScmpActKillProcess,
    LinuxSeccompAction::ScmpActKillThread,
    LinuxSeccompAction::ScmpActLog,
    LinuxSeccompAction::ScmpActNotify,
    LinuxSeccompAction::ScmpActTrace,
    LinuxSeccompAction::ScmpActTrap,
];

/// Seccomp argument comparisons libcontainer translates.
const SECCOMP_OPERATORS: [LinuxSeccompOperator; 7] = [
    LinuxSeccompOperator::ScmpCmpEq,
    LinuxSeccompOperator::ScmpCmpGe,
    LinuxSeccompOperator::ScmpCmpGt,
    LinuxSeccompOperator::ScmpCmpLe,
    LinuxSeccompOperator::ScmpCmpLt,
    LinuxSeccompOperator::ScmpCmpMaskedEq,
    LinuxSeccompOperator::ScmpCmpNe,
];

/// Seccomp architectures libcontainer maps to libseccomp's.
const SECCOMP_ARCHS: [Arch; 23] = [
    Arch::ScmpArchAarch64,
    Arch::ScmpArchArm,
    Arch::ScmpArchLoongarch64,
    Arch::ScmpArchM68k,
    Arch::ScmpArchMips,
    Arch::ScmpArchMips64,
    Arch::ScmpArchMips64n32,
    Arch::ScmpArchMipsel,
    Arch::ScmpArchMipsel64,
    Arch::ScmpArchMipsel64n32,
    Arch::ScmpArchParisc,
    Arch::ScmpArchParisc64,
    Arch::ScmpArchPpc,
    Arch::ScmpArchPpc64,
    Arch::ScmpArchPpc64le,
    Arch::ScmpArchRiscv64,
    Arch::ScmpArchS390,
    Arch::ScmpArchS390x,
    Arch::ScmpArchSh,
    Arch::ScmpArchSheb,
    Arch::ScmpArchX32,
    Arch::ScmpArchX86,
    Arch::ScmpArchX86_64,
];

/// What the running kernel offers that some features depend on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    /// `mount_setattr(2)` exists (the recursive `r*` mount options).
    pub mount_setattr: bool,
    /// Namespace kinds the kernel has (`/proc/self/ns/<name>`), by their
    /// `/proc` names (`mnt`, `net`, `pid`, ...).
    pub namespaces: Vec<String>,
    /// Capability names the kernel knows (`CAP_CHOWN`, ...).
    pub capabilities: Vec<String>,
}

impl Kernel {
    /// Probes the running kernel.
    pub fn probe() -> Kernel {
        let namespaces = std::fs::read_dir("/proc/self/ns")
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let mut capabilities: Vec<caps::Capability> = caps::runtime::thread_all_supported().into_iter().collect();
        capabilities.sort_by_key(|c| c.index());
        let capabilities = capabilities.iter().map(|c| c.to_string()).collect();
        Kernel {
            mount_setattr: has_mount_setattr(),
            namespaces,
            capabilities,
        }
    }
}

/// Whether `mount_setattr(2)` exists: a call with invalid flags fails
/// with `EINVAL` before doing anything when it does, `ENOSYS` when not.
fn has_mount_setattr() -> bool {
    use libcontainer::syscall::{SyscallError, linux::MountAttr, syscall::create_syscall};
    let Ok(root) = std::fs::File::open("/") else {
        return false;
    };
    let attr = MountAttr {
        attr_set: 0,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let r = create_syscall().mount_setattr(
        std::os::fd::AsFd::as_fd(&root),
        Path::new(""),
        u32::MAX,
        &attr,
        std::mem::size_of::<MountAttr>(),
    );
    !matches!(r, Err(SyscallError::Nix(nix::errno::Errno::ENOSYS)))
}

/// The `/proc/self/ns` name of a namespace kind.
fn proc_name(ns: LinuxNamespaceType) -> &'static str {
    match ns {
        LinuxNamespaceType::Cgroup => "cgroup",
        LinuxNamespaceType::Ipc => "ipc",
        LinuxNamespaceType::Mount => "mnt",
        LinuxNamespaceType::Network => "net",
        LinuxNamespaceType::Pid => "pid",
        LinuxNamespaceType::User => "user",
        LinuxNamespaceType::Uts => "uts",
        LinuxNamespaceType::Time => "time",
    }
}

/// An operator's runtime-spec name (`SCMP_CMP_EQ`, ...).
fn operator_name(op: LinuxSeccompOperator) -> String {
    serde_json::to_value(op)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The runtime-spec features of this shim on `kernel`.
pub fn features(kernel: &Kernel) -> OciFeatures {
    use oci_spec::runtime::{
        ApparmorBuilder, CgroupBuilder, FeaturesBuilder, IDMapBuilder, LinuxFeatureBuilder, MountExtensionsBuilder,
        SeccompBuilder, SelinuxBuilder,
    };
    let mut mount_options: Vec<String> = MOUNT_FLAG_OPTIONS.iter().map(|s| s.to_string()).collect();
    if kernel.mount_setattr {
        mount_options.extend(RECURSIVE_MOUNT_OPTIONS.iter().map(|s| s.to_string()));
        mount_options.extend(IDMAP_MOUNT_OPTIONS.iter().map(|s| s.to_string()));
    }
    mount_options.sort();
    let namespaces: Vec<LinuxNamespaceType> = NAMESPACES
        .into_iter()
        .filter(|ns| kernel.namespaces.iter().any(|k| k == proc_name(*ns)))
        .collect();
    // The builders take every field by value and cannot fail here: each
    // field has a value of its own type.
    let linux = LinuxFeatureBuilder::default()
        .namespaces(namespaces)
        .capabilities(kernel.capabilities.clone())
        .cgroup(
            CgroupBuilder::default()
                .v1(true)
                .v2(true)
                .systemd(true)
                .systemd_user(false)
                .build()
                .expect("cgroup features"),
        )
        .seccomp(
            SeccompBuilder::default()
                .enabled(true)
                .actions(SECCOMP_ACTIONS.to_vec())
                .operators(SECCOMP_OPERATORS.iter().map(|o| operator_name(*o)).collect::<Vec<_>>())
                .archs(SECCOMP_ARCHS.to_vec())
                .build()
                .expect("seccomp features"),
        )
        .apparmor(
            ApparmorBuilder::default()
                .enabled(true)
                .build()
                .expect("apparmor features"),
        )
        .selinux(
            SelinuxBuilder::default()
                .enabled(false)
                .build()
                .expect("selinux features"),
        )
        .mount_extensions(
            MountExtensionsBuilder::default()
                .idmap(
                    IDMapBuilder::default()
                        .enabled(kernel.mount_setattr)
                        .build()
                        .expect("idmap features"),
                )
                .build()
                .expect("mount extension features"),
        )
        .build()
        .expect("linux features");
    FeaturesBuilder::default()
        .oci_version_min("1.0.0")
        .oci_version_max(oci_spec::runtime::VERSION)
        .hooks(
            crate::container::bundle::OCI_HOOKS
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>(),
        )
        .mount_options(mount_options)
        .linux(linux)
        .build()
        .expect("features")
}

/// `features` as containerd reads it: JSON without the absent (null) fields,
/// as `runc features` prints it.
pub fn features_json(features: &OciFeatures) -> Result<Vec<u8>, InfoError> {
    let mut v = serde_json::to_value(features).map_err(InfoError::Features)?;
    strip_nulls(&mut v);
    serde_json::to_vec(&v).map_err(InfoError::Features)
}

fn strip_nulls(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.retain(|_, v| !v.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

/// The `RuntimeInfo` for `-info`: `options` are the bytes containerd wrote
/// to stdin (a protobuf `Any`, possibly empty), echoed back decoded.
///
/// # Errors
/// [`InfoError::Options`] when `options` is not empty and not an `Any`.
pub fn runtime_info(options: &[u8], kernel: &Kernel) -> Result<RuntimeInfo, InfoError> {
    let options = if options.is_empty() {
        MessageField::none()
    } else {
        MessageField::some(Any::parse_from_bytes(options).map_err(|source| InfoError::Options {
            len: options.len(),
            source,
        })?)
    };
    Ok(RuntimeInfo {
        name: RUNTIME_NAME.into(),
        version: MessageField::some(RuntimeVersion {
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        }),
        options,
        features: MessageField::some(Any {
            type_url: FEATURES_TYPE_URL.into(),
            value: features_json(&features(kernel))?,
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// `-info`: reads the runtime options from `input`, writes the encoded
/// [`RuntimeInfo`] to `output`.
///
/// # Errors
/// Reading stdin or writing stdout fails, or [`runtime_info`] fails.
pub fn info_action(mut input: impl std::io::Read, mut output: impl std::io::Write) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let mut options = Vec::new();
    input
        .read_to_end(&mut options)
        .context("read runtime options from stdin")?;
    let info = runtime_info(&options, &Kernel::probe())?;
    output
        .write_all(&info.write_to_bytes().map_err(InfoError::Encode)?)
        .context("write RuntimeInfo to stdout")?;
    output.flush().context("write RuntimeInfo to stdout")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(mount_setattr: bool) -> Kernel {
        Kernel {
            mount_setattr,
            namespaces: ["cgroup", "ipc", "mnt", "net", "pid", "user", "uts"]
                .map(String::from)
                .to_vec(),
            capabilities: vec!["CAP_CHOWN".into(), "CAP_SYS_ADMIN".into()],
        }
    }

    fn json(info: &RuntimeInfo) -> serde_json::Value {
        serde_json::from_slice(&info.features.value).unwrap()
    }

    #[test]
    fn runtime_info_carries_the_features_json_under_containerds_type_url() {
        let info = runtime_info(&[], &kernel(true)).unwrap();
        assert_eq!(info.name, "io.containerd.nri-shim.v2");
        assert_eq!(info.version.version, env!("CARGO_PKG_VERSION"));
        assert!(info.options.is_none());
        assert_eq!(
            info.features.type_url,
            "types.containerd.io/opencontainers/runtime-spec/1/features/Features"
        );
        let f = json(&info);
        assert_eq!(f["ociVersionMin"], "1.0.0");
        assert_eq!(
            f["linux"]["namespaces"],
            serde_json::json!(["cgroup", "ipc", "mount", "network", "pid", "user", "uts"])
        );
        assert_eq!(
            f["linux"]["capabilities"],
            serde_json::json!(["CAP_CHOWN", "CAP_SYS_ADMIN"])
        );
        assert_eq!(
            f["linux"]["cgroup"],
            serde_json::json!({"v1": true, "v2": true, "systemd": true, "systemdUser": false})
        );
        assert_eq!(f["linux"]["mountExtensions"]["idmap"]["enabled"], true);
        assert_eq!(f["linux"]["selinux"]["enabled"], false);
        let seccomp = &f["linux"]["seccomp"];
        assert_eq!(seccomp["enabled"], true);
        for (key, value) in [
            ("actions", "SCMP_ACT_ERRNO"),
            ("operators", "SCMP_CMP_MASKED_EQ"),
            ("archs", "SCMP_ARCH_X86_64"),
        ] {
            assert!(
                seccomp[key].as_array().unwrap().iter().any(|v| v == value),
                "{key}: {}",
                seccomp[key]
            );
        }
        // Absent fields are left out, not null (Go reads either; runc omits).
        assert!(!String::from_utf8(info.features.value.clone()).unwrap().contains("null"));
        // The document parses back as runtime-spec Features.
        let back: OciFeatures = serde_json::from_slice(&info.features.value).unwrap();
        assert_eq!(back.hooks().as_ref().unwrap().len(), 6);
    }

    #[test]
    fn recursive_mount_options_only_with_mount_setattr() {
        let with = json(&runtime_info(&[], &kernel(true)).unwrap());
        let without = json(&runtime_info(&[], &kernel(false)).unwrap());
        let has = |f: &serde_json::Value, o: &str| f["mountOptions"].as_array().unwrap().iter().any(|v| v == o);
        for o in ["rro", "rnosuid", "rnosymfollow", "idmap", "ridmap"] {
            assert!(has(&with, o) && !has(&without, o), "{o}");
        }
        for o in ["ro", "rbind", "rslave", "nosuid"] {
            assert!(has(&with, o) && has(&without, o), "{o}");
        }
        let idmap = |f: &serde_json::Value| f["linux"]["mountExtensions"]["idmap"]["enabled"].clone();
        assert_eq!((idmap(&with), idmap(&without)), (true.into(), false.into()));
    }

    #[test]
    fn namespaces_the_kernel_lacks_are_not_claimed() {
        let mut k = kernel(true);
        k.namespaces.retain(|n| n != "cgroup");
        k.namespaces.push("time".into());
        let f = json(&runtime_info(&[], &k).unwrap());
        assert_eq!(
            f["linux"]["namespaces"],
            serde_json::json!(["ipc", "mount", "network", "pid", "time", "user", "uts"])
        );
    }

    #[test]
    fn options_are_echoed_and_garbage_is_refused() {
        let opts = Any {
            type_url: "containerd.runc.v1.Options".into(),
            value: vec![0x0a, 0x03, b'a', b'b', b'c'],
            ..Default::default()
        };
        let info = runtime_info(&opts.write_to_bytes().unwrap(), &kernel(true)).unwrap();
        assert_eq!(info.options.as_ref(), Some(&opts));
        let err = runtime_info(&[0xff, 0xff, 0xff], &kernel(true)).unwrap_err();
        assert!(matches!(err, InfoError::Options { len: 3, .. }), "{err}");
    }

    #[test]
    fn kernel_probe_sees_this_machine() {
        let k = Kernel::probe();
        assert!(k.namespaces.iter().any(|n| n == "pid"), "{k:?}");
        assert_eq!(k.capabilities.first().map(String::as_str), Some("CAP_CHOWN"));
        // Linux 5.12+ (the machines the project runs on).
        assert!(k.mount_setattr);
    }
}
