//! Shim errors and their ttrpc status codes.
//!
//! containerd acts on the code, not the text: a kill of an exited task must
//! be `NotFound` for CRI's stop path to proceed (containerd #6665), a
//! repeated create `AlreadyExists`, an illegal transition
//! `FailedPrecondition`. `Unknown` ("Others") is only for the unexpected.

use ttrpc::Code;

/// What went wrong serving a task request.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// No such task, process, or the process already exited.
    #[error("{0}")]
    NotFound(String),
    /// A task or exec with that id exists.
    #[error("{0}")]
    AlreadyExists(String),
    /// The request is malformed (bad spec, bad stdio URI, ...).
    #[error("{0}")]
    InvalidArgument(String),
    /// The request is not allowed in the task's current state.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The feature is not implemented by this shim.
    #[error("{0}")]
    Unimplemented(String),
    /// NRI plugins refused the container (conflict, rejection, plugin error).
    #[error(transparent)]
    Nri(#[from] nri_adaptation::Error),
    /// The adjusted spec could not be applied.
    #[error("NRI adjustment")]
    Adjust(#[from] nri_adaptation::AdjustError),
    /// CDI devices requested by annotations could not be injected.
    #[error("CDI devices")]
    Cdi(#[from] crate::cdi::CdiError),
    /// Running the container failed.
    #[error("runtime: {0}")]
    Runtime(String),
    /// I/O on the bundle, fifos or sockets failed.
    #[error("{context}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

impl ShimError {
    /// An [`ShimError::Io`] with context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ShimError::Io {
            context: context.into(),
            source,
        }
    }

    /// The ttrpc status code containerd sees.
    pub fn code(&self) -> Code {
        match self {
            ShimError::NotFound(_) => Code::NOT_FOUND,
            ShimError::AlreadyExists(_) => Code::ALREADY_EXISTS,
            ShimError::InvalidArgument(_) | ShimError::Adjust(_) | ShimError::Cdi(_) => Code::INVALID_ARGUMENT,
            ShimError::FailedPrecondition(_) | ShimError::Nri(_) => Code::FAILED_PRECONDITION,
            ShimError::Unimplemented(_) => Code::UNIMPLEMENTED,
            ShimError::Runtime(_) | ShimError::Io { .. } => Code::UNKNOWN,
        }
    }
}

/// What Go's errdefs appends to a not-found error's text, as runc's shim
/// sends it (`process already finished: not found`).
const NOT_FOUND_SUFFIX: &str = ": not found";

impl From<ShimError> for ttrpc::Error {
    /// The status message is the whole [`chain`]: containerd shows it as
    /// is, and the root cause (path, errno, plugin) is usually the last link.
    /// A not-found message ends in `: not found`, as runc's shim's do:
    /// containerd 1.x strips and re-adds that suffix, 2.x shows the text as
    /// sent, so `ctr` says "not found" on both, as with runc.
    fn from(e: ShimError) -> Self {
        let mut message = chain(&e);
        if e.code() == Code::NOT_FOUND && !message.ends_with(NOT_FOUND_SUFFIX) {
            message.push_str(NOT_FOUND_SUFFIX);
        }
        ttrpc::Error::RpcStatus(ttrpc::get_status(e.code(), message))
    }
}

/// `e` and its causes on one line, outermost first, `: `-separated.
///
/// Errors here follow the std convention: a message says what failed at
/// its own level and leaves its cause to [`std::error::Error::source`], so
/// whoever shows an error to a person (a ttrpc reply, a log line, an exit
/// message) walks the chain once, here.
///
/// Some library errors (libcontainer's, libcgroups') put their source in
/// their own text as well; a cause whose text the message before it
/// already ends with is left out, so it is not read twice (`could not delete:
/// at /sys/fs/cgroup/...: could not delete`).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out: Vec<String> = Vec::new();
    for cause in std::iter::successors(Some(e), |e| e.source()) {
        let text = cause.to_string();
        if out.last().is_some_and(|prev| prev.ends_with(&text)) {
            continue;
        }
        out.push(text);
    }
    out.join(": ")
}

/// Result of task operations.
pub type Result<T> = std::result::Result<T, ShimError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Wrapped {
        /// Says its source in its own text, as libcontainer's errors do.
        #[error("io error: {0}")]
        Io(#[source] std::io::Error),
        #[error("delete failed")]
        Outer(#[source] Box<Wrapped>),
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let io = || std::io::Error::other("at /sys/fs/cgroup/x: could not delete");
        assert_eq!(
            chain(&Wrapped::Io(io())),
            "io error: at /sys/fs/cgroup/x: could not delete"
        );
        assert_eq!(
            chain(&Wrapped::Outer(Box::new(Wrapped::Io(io())))),
            "delete failed: io error: at /sys/fs/cgroup/x: could not delete"
        );
        // A cause that only looks alike is kept.
        let e = ShimError::io("open /run/x", std::io::Error::other("open"));
        assert_eq!(chain(&e), "open /run/x: open");
    }

    #[test]
    fn every_variant_maps_to_its_code() {
        let cases: Vec<(ShimError, Code)> = vec![
            (ShimError::NotFound("x".into()), Code::NOT_FOUND),
            (ShimError::AlreadyExists("x".into()), Code::ALREADY_EXISTS),
            (ShimError::InvalidArgument("x".into()), Code::INVALID_ARGUMENT),
            (ShimError::FailedPrecondition("x".into()), Code::FAILED_PRECONDITION),
            (ShimError::Unimplemented("x".into()), Code::UNIMPLEMENTED),
            (
                ShimError::Nri(nri_adaptation::Error::NotRunning),
                Code::FAILED_PRECONDITION,
            ),
            (
                ShimError::Adjust(nri_adaptation::AdjustError::Unsupported {
                    field: "f".into(),
                    reason: "r".into(),
                }),
                Code::INVALID_ARGUMENT,
            ),
            (
                ShimError::Cdi(crate::cdi::CdiError::InvalidName {
                    name: "n".into(),
                    reason: "r".into(),
                }),
                Code::INVALID_ARGUMENT,
            ),
            (ShimError::Runtime("x".into()), Code::UNKNOWN),
            (ShimError::io("ctx", std::io::ErrorKind::Other.into()), Code::UNKNOWN),
        ];
        for (e, code) in cases {
            let text = chain(&e);
            match ttrpc::Error::from(e) {
                ttrpc::Error::RpcStatus(s) => {
                    assert_eq!(s.code(), code, "{text}");
                    if code == Code::NOT_FOUND {
                        assert_eq!(s.message(), format!("{text}: not found"));
                    } else {
                        assert_eq!(s.message(), text);
                    }
                }
                other => panic!("not a status: {other:?}"),
            }
        }
    }
}
