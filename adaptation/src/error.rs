//! Errors of the runtime side of NRI.

use std::{path::PathBuf, time::Duration};

/// Error type of runtime callbacks (sync, update, evict).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What went wrong talking to one plugin.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The plugin answered with an error status. Fails the runtime request;
    /// the plugin stays registered (NRI `isFatalError` = false).
    #[error("plugin returned error: {message}")]
    Returned {
        /// ttrpc status code.
        code: ttrpc::Code,
        /// The status message.
        message: String,
    },
    /// No answer within the request timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The connection to the plugin is closed.
    #[error("connection closed")]
    Closed,
    /// ttrpc or mux transport failure (fatal: the plugin is dropped).
    #[error("transport error: {0}")]
    Transport(String),
    /// The plugin's answer breaks the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A WebAssembly plugin trapped, exited, ran out of memory or answered
    /// garbage (see [`crate::wasm`]); fatal: the plugin is dropped.
    #[error("WebAssembly plugin {0}")]
    Wasm(#[from] crate::wasm::WasmCallError),
}

impl PluginError {
    /// Fatal errors close the plugin (NRI: closed, server closed, protocol
    /// error, local deadline); the others are the plugin's own verdict.
    pub fn is_fatal(&self) -> bool {
        !matches!(self, PluginError::Returned { .. })
    }

    /// Classifies the error of a request sent with deadline `timeout`.
    /// Both ends enforce the deadline: ttrpc's local timer ("deadline
    /// elapsed") and the plugin's ttrpc server, which answers
    /// DEADLINE_EXCEEDED ("timeout") when its handler overruns. Whichever
    /// comes first, it is a timeout, so the failure policy applies.
    pub(crate) fn from_ttrpc_request(e: ttrpc::Error, timeout: Duration) -> PluginError {
        match e {
            ttrpc::Error::Others(m) if m.contains("deadline elapsed") => PluginError::Timeout(timeout),
            ttrpc::Error::RpcStatus(s) if s.code() == ttrpc::Code::DEADLINE_EXCEEDED => PluginError::Timeout(timeout),
            other => PluginError::from_ttrpc(other),
        }
    }

    pub(crate) fn from_ttrpc(e: ttrpc::Error) -> PluginError {
        match e {
            ttrpc::Error::RpcStatus(s) => PluginError::Returned {
                code: s.code(),
                message: s.message().to_string(),
            },
            ttrpc::Error::RemoteClosed | ttrpc::Error::LocalClosed | ttrpc::Error::Eof => PluginError::Closed,
            other => PluginError::Transport(other.to_string()),
        }
    }

    /// Whether the plugin does not implement the method (gRPC Unimplemented;
    /// ttrpc-rust servers say NotFound "... is not supported").
    pub(crate) fn is_unimplemented(&self) -> bool {
        match self {
            PluginError::Returned { code, message } => {
                *code == ttrpc::Code::UNIMPLEMENTED
                    || (*code == ttrpc::Code::NOT_FOUND && message.ends_with("is not supported"))
            }
            _ => false,
        }
    }
}

/// Why the validation of a merged adjustment failed the create: the
/// first verdict in plugin order (the built-in validator first).
///
/// A runtime branches on the kind: a rejection is a policy decision about
/// this container (do not retry it unchanged), a failure says nothing
/// about the container (the validator timed out or its connection broke;
/// with `ignore` it is dropped, so a retry may pass).
#[derive(Debug, thiserror::Error)]
pub enum ValidationError {
    /// The validator looked at the adjustment and refused it.
    #[error("validator {validator:?} rejected container adjustment, reason: {reason}")]
    Rejected {
        /// `IDX-NAME` of the validator (`00-default-validator` for the built-in one).
        validator: String,
        /// The validator's reason (`unknown rejection reason` when it gave none).
        reason: String,
    },
    /// The validator plugin gave no verdict.
    #[error("validator plugin {validator} failed")]
    Failed {
        /// `IDX-NAME` of the validator plugin.
        validator: String,
        /// What happened (a timeout, a closed connection, ...).
        source: PluginError,
    },
}

impl ValidationError {
    /// `IDX-NAME` of the validator that failed the create.
    pub fn validator(&self) -> &str {
        match self {
            ValidationError::Rejected { validator, .. } | ValidationError::Failed { validator, .. } => validator,
        }
    }
}

/// Errors of [`Adaptation`](crate::Adaptation).
///
/// A runtime can tell what happened from the type alone, without reading
/// the text:
///
/// | error | what happened |
/// |---|---|
/// | `Plugin { source: PluginError::Timeout(_), .. }` | the plugin did not answer within the request timeout |
/// | `Plugin { source: PluginError::Returned { code, .. }, .. }` | the plugin answered with an error of its own |
/// | `Plugin { source: PluginError::Closed \| Transport(_) \| Protocol(_), .. }` | the connection to the plugin broke; the plugin is dropped ([`PluginError::is_fatal`]) |
/// | `Plugin { source: PluginError::Wasm(_), .. }` | a WebAssembly plugin trapped, exited, ran out of memory or answered garbage; the plugin is dropped |
/// | `Validation(ValidationError::Rejected { .. })` | a validator refused the merged adjustment: do not retry the container unchanged |
/// | `Validation(ValidationError::Failed { source, .. })` | a validator gave no verdict (`source` says why: timeout, transport, ...) |
/// | `Merge(_)` | plugins' adjustments conflict, or one updated the container being created |
/// | `Permission(_)` | a plugin with failure policy `fail` touched a field outside its permissions |
/// | `NotRunning` | the adaptation was stopped |
///
/// A plugin error only fails the runtime's request when the plugin's
/// [`FailurePolicy`](crate::FailurePolicy) says so; otherwise it is logged
/// and the plugin is left out.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The builder is missing a required runtime callback.
    #[error("NRI adaptation needs a {0} callback")]
    MissingCallback(&'static str),
    /// The external plugin socket could not be set up.
    #[error("failed to set up NRI socket {path}: {what}")]
    Socket {
        /// The configured socket path.
        path: PathBuf,
        /// Which step failed.
        what: &'static str,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The plugin directory could not be read.
    #[error("failed to read NRI plugin directory {path}")]
    PluginDir {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A builtin plugin failed to configure or synchronize.
    #[error("builtin NRI plugin {plugin} failed to start: {reason}")]
    Builtin {
        /// `IDX-NAME`.
        plugin: String,
        /// What failed.
        reason: String,
    },
    /// The runtime's sync callback failed.
    #[error("runtime failed to list pods and containers for NRI sync")]
    SyncCallback(#[source] BoxError),
    /// A plugin failed a request in a way that fails the runtime's request.
    #[error("NRI plugin {plugin} failed {event}")]
    Plugin {
        /// `IDX-NAME` of the plugin.
        plugin: String,
        /// The request, e.g. `CreateContainer`.
        event: &'static str,
        /// What happened.
        source: PluginError,
    },
    /// Plugins' adjustments conflict, or one asked for something not allowed.
    #[error(transparent)]
    Merge(#[from] crate::result::MergeError),
    /// A validator rejected or failed the merged adjustment.
    #[error(transparent)]
    Validation(#[from] ValidationError),
    /// A plugin (failure policy `fail`) touched a field outside its
    /// permissions; nothing of its answer was applied.
    #[error(transparent)]
    Permission(#[from] crate::permissions::PermissionError),
    /// The adaptation was stopped (or never started).
    #[error("NRI adaptation is not running")]
    NotRunning,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed validation errors say what failed at their level and keep
    /// the plugin error as the source (std convention: the cause is not
    /// repeated in the message, so a chain printer shows it once).
    #[test]
    fn validation_errors_keep_their_text_and_source() {
        let rejected = Error::from(ValidationError::Rejected {
            validator: "90-reject".into(),
            reason: "no".into(),
        });
        assert_eq!(
            rejected.to_string(),
            r#"validator "90-reject" rejected container adjustment, reason: no"#
        );
        let failed = Error::from(ValidationError::Failed {
            validator: "90-slow".into(),
            source: PluginError::Timeout(Duration::from_secs(2)),
        });
        assert_eq!(failed.to_string(), "validator plugin 90-slow failed");
        let source = std::error::Error::source(&failed).expect("the plugin error");
        assert_eq!(source.to_string(), "no answer within 2s");
        assert!(source.source().is_none());
        let Error::Validation(v) = failed else { unreachable!() };
        assert_eq!(v.validator(), "90-slow");
    }

    fn status(code: ttrpc::Code, msg: &str) -> ttrpc::Error {
        ttrpc::Error::RpcStatus(ttrpc::get_status(code, msg))
    }

    /// A plugin whose own ttrpc server answers "timeout" at the deadline
    /// timed out, exactly like one whose answer never came: the failure
    /// policy applies (`ignore` drops it) instead of failing the request.
    #[test]
    fn both_ends_of_a_deadline_are_a_timeout() {
        let t = Duration::from_millis(500);
        for e in [
            status(ttrpc::Code::DEADLINE_EXCEEDED, "timeout"),
            ttrpc::Error::Others("Receive packet timeout deadline elapsed".into()),
        ] {
            let c = PluginError::from_ttrpc_request(e, t);
            assert!(matches!(c, PluginError::Timeout(d) if d == t), "{c:?}");
            assert!(c.is_fatal());
        }
        let own = PluginError::from_ttrpc_request(status(ttrpc::Code::INVALID_ARGUMENT, "no"), t);
        assert!(matches!(own, PluginError::Returned { .. }), "{own:?}");
        assert!(!own.is_fatal());
    }
}
