//! [`Observer`]: what a runtime may count about plugins (for metrics),
//! told by the adaptation as it happens, without the adaptation depending
//! on a metrics library.

use std::time::Duration;

/// How one request to a plugin ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The plugin answered.
    Ok,
    /// No answer within the request timeout.
    Timeout,
    /// Any other failure: the plugin's own error, a broken connection, a
    /// protocol violation.
    Error,
}

impl Outcome {
    /// `ok`, `timeout` or `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Timeout => "timeout",
            Outcome::Error => "error",
        }
    }
}

/// Why the adaptation refused a plugin's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rejection {
    /// Its adjustment or update conflicted with an earlier plugin's (or it
    /// updated the container being created).
    Conflict,
    /// The plugin, as a validator, rejected the merged adjustment.
    Validation,
    /// It touched a field outside its permissions (see
    /// [`crate::permissions`]); told whether its failure policy failed the
    /// request or dropped the answer.
    Permission,
}

impl Rejection {
    /// `conflict`, `validation` or `permission`.
    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::Conflict => "conflict",
            Rejection::Validation => "validation",
            Rejection::Permission => "permission",
        }
    }
}

/// Told about every plugin request and every refused answer; set with
/// [`AdaptationBuilder::with_observer`](crate::AdaptationBuilder::with_observer).
///
/// Called inline on the request path: an implementation must be quick and
/// must not block (update counters, nothing more).
pub trait Observer: Send + Sync + 'static {
    /// `plugin` (`IDX-NAME`) answered, or failed, `request` (the NRI
    /// request name: `Configure`, `Synchronize`, `CreateContainer`,
    /// `ValidateContainerAdjustment`, ...) after `elapsed`.
    fn request(&self, plugin: &str, request: &'static str, elapsed: Duration, outcome: Outcome);

    /// `plugin`'s answer was refused: failing the runtime's request, or,
    /// for a [`Rejection::Permission`] under failure policy `ignore`,
    /// dropped.
    fn rejected(&self, plugin: &str, rejection: Rejection);
}
