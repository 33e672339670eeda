//! The stub builder and where a plugin's name and index come from.

use std::{path::PathBuf, sync::Arc, time::Duration};

use nri_proto::{events::EventMask, naming, plugin::Plugin};

use crate::{StubError, stub::Stub};

/// Name and index from, in order: the builder, the environment, an
/// `IDX-NAME` executable name; then the executable's name for the name (as
/// Go's `pkg/stub` does) and the builder's default for the index.
fn resolve_identity(
    builder: (Option<String>, Option<String>),
    env: (Option<String>, Option<String>),
    exe: Option<String>,
    default_idx: Option<String>,
) -> Result<(String, String), StubError> {
    let from_exe = exe
        .as_deref()
        .and_then(|e| naming::parse_plugin_file_name(e).ok())
        .map(|(i, n)| (Some(i), Some(n)))
        .unwrap_or((None, None));
    let name = builder
        .0
        .or(env.0)
        .or(from_exe.1)
        .or(exe)
        .ok_or(StubError::MissingName)?;
    let idx = builder
        .1
        .or(env.1)
        .or(from_exe.0)
        .or(default_idx)
        .ok_or(StubError::MissingIndex)?;
    Ok((name, idx))
}

/// Builds a [`Stub`]; see the crate docs for the settings and their sources.
pub struct StubBuilder {
    pub(crate) plugin: Arc<dyn Plugin>,
    pub(crate) name: Option<String>,
    pub(crate) idx: Option<String>,
    pub(crate) default_idx: Option<String>,
    pub(crate) socket_path: Option<PathBuf>,
    pub(crate) events: EventMask,
    pub(crate) registration_timeout: Duration,
}

impl StubBuilder {
    /// Sets the plugin name (overrides `NRI_PLUGIN_NAME`).
    pub fn with_plugin_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Sets the two-digit plugin index (overrides `NRI_PLUGIN_IDX`).
    pub fn with_plugin_idx(mut self, idx: impl Into<String>) -> Self {
        self.idx = Some(idx.into());
        self
    }

    /// The index to use when neither [`with_plugin_idx`](Self::with_plugin_idx),
    /// `NRI_PLUGIN_IDX` nor an `IDX-NAME` executable name gives one: lets a
    /// plugin binary run by hand without flags yet still take the index the
    /// runtime launched it with.
    pub fn with_default_plugin_idx(mut self, idx: impl Into<String>) -> Self {
        self.default_idx = Some(idx.into());
        self
    }

    /// Dials this socket instead of `/var/run/nri/nri.sock`. Ignored when the
    /// runtime launched the plugin with a pre-connected `NRI_PLUGIN_SOCKET`.
    pub fn with_socket_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.socket_path = Some(path.into());
        self
    }

    /// The events to subscribe to (see [`EventMask::parse`]).
    pub fn with_events(mut self, events: EventMask) -> Self {
        self.events = events;
        self
    }

    /// How long RegisterPlugin may take before the stub gives up (default 5 s).
    pub fn with_registration_timeout(mut self, timeout: Duration) -> Self {
        self.registration_timeout = timeout;
        self
    }

    /// Resolves name and index (see the crate docs) and checks them.
    ///
    /// # Errors
    /// [`StubError::MissingName`], [`StubError::MissingIndex`],
    /// [`StubError::Naming`] or [`StubError::NoEvents`].
    pub fn build(self) -> Result<Stub, StubError> {
        let exe = std::env::args()
            .next()
            .and_then(|a| Some(std::path::Path::new(&a).file_name()?.to_str()?.to_string()))
            .filter(|b| !b.is_empty());
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let (name, idx) = resolve_identity(
            (self.name, self.idx),
            (env(nri_proto::PLUGIN_NAME_ENV), env(nri_proto::PLUGIN_IDX_ENV)),
            exe,
            self.default_idx,
        )?;
        naming::check_index(&idx)?;
        naming::check_name(&name)?;
        if self.events.bits() == 0 {
            return Err(StubError::NoEvents);
        }
        Ok(Stub {
            plugin: self.plugin,
            name,
            idx,
            socket_path: self
                .socket_path
                .unwrap_or_else(|| PathBuf::from(nri_proto::DEFAULT_SOCKET_PATH)),
            events: self.events,
            registration_timeout: self.registration_timeout,
        })
    }
}

#[cfg(test)]
mod identity_tests {
    use super::*;

    fn s(v: &str) -> Option<String> {
        Some(v.to_string())
    }

    fn resolve(
        builder: (Option<String>, Option<String>),
        env: (Option<String>, Option<String>),
        exe: Option<String>,
        default_idx: Option<String>,
    ) -> (String, String) {
        resolve_identity(builder, env, exe, default_idx).unwrap()
    }

    #[test]
    fn builder_then_environment_then_executable_then_defaults() {
        let none = (None, None);
        assert_eq!(
            resolve((s("b"), s("05")), (s("e"), s("06")), s("07-x"), s("99")),
            ("b".into(), "05".into())
        );
        assert_eq!(
            resolve(none.clone(), (s("e"), s("06")), s("07-x"), s("99")),
            ("e".into(), "06".into())
        );
        // Launched by the runtime as plugins/07-x: the file name gives both.
        assert_eq!(
            resolve(none.clone(), none.clone(), s("07-x"), s("99")),
            ("x".into(), "07".into())
        );
        // Run by hand: the executable's name and the default index.
        assert_eq!(
            resolve(none.clone(), none.clone(), s("nri-adjuster"), s("10")),
            ("nri-adjuster".into(), "10".into())
        );
    }

    #[test]
    fn errors_leave_their_cause_to_source() {
        let e = StubError::Connect {
            path: "/x.sock".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert_eq!(e.to_string(), "failed to connect to the NRI socket /x.sock");
        let source = std::error::Error::source(&e).expect("the io error");
        assert_eq!(source.to_string(), "entity not found");
    }

    #[test]
    fn missing_index_without_default_is_an_error() {
        let e = resolve_identity((None, None), (None, None), s("nri-adjuster"), None).unwrap_err();
        assert!(matches!(e, StubError::MissingIndex), "{e}");
        let e = resolve_identity((None, s("10")), (None, None), None, None).unwrap_err();
        assert!(matches!(e, StubError::MissingName), "{e}");
    }
}
