//! During kernel initialization, a minimal replica of the ramfs filesystem is
//! loaded, called rootfs.  Most systems mount another filesystem over it

#[allow(clippy::module_inception)]
pub(crate) mod rootfs;
pub use rootfs::RootFS;

pub mod device;
pub use device::Device;

pub(super) mod mount;
pub use mount::Mount;

pub(super) mod symlink;

pub mod utils;

#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error("failed syscall")]
    Syscall(#[from] crate::syscall::SyscallError),
    #[error(transparent)]
    MissingSpec(#[from] crate::error::MissingSpecError),
    #[error("unknown rootfs propagation")]
    UnknownRootfsPropagation(String),
    #[error(transparent)]
    Symlink(#[from] symlink::SymlinkError),
    #[error(transparent)]
    Mount(#[from] mount::MountError),
    /// nri-shim patch: a spec mount that failed, named as runc names it
    /// (`error mounting "src" to rootfs at "dest"`); pinned by nri-shim's
    /// runc_parity test errors_name_the_mount_path_and_errno.
    #[error(
        "error mounting {mount_source:?} ({typ}, options {options:?}) to rootfs at {destination:?}"
    )]
    SpecMount {
        mount_source: String,
        typ: String,
        options: Vec<String>,
        destination: std::path::PathBuf,
        #[source]
        err: mount::MountError,
    },
    #[error(transparent)]
    Device(#[from] device::DeviceError),
}

type Result<T> = std::result::Result<T, RootfsError>;
