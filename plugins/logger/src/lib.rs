//! # nri-logger
//!
//! A sample NRI plugin that logs every request the runtime sends it:
//! Configure, Synchronize, every pod and container lifecycle event,
//! ValidateContainerAdjustment and Shutdown. It changes nothing.
//!
//! Each request becomes one [`Record`], written
//! * with `tracing` as one text line: the event name, the pod as
//!   `namespace/name (id)`, the container as `name (id)`, and for
//!   CreateContainer and UpdateContainer the number of annotations and
//!   environment variables and the resources, e.g.
//!   `CreateContainer pod=default/web (p1) container=app (c1) annotations=5 env=3 resources=[cpu.period=100000 cpu.quota=50000 cpu.shares=1024 memory.limit=268435456 memory.swap=268435456]`;
//! * optionally as one JSON object per line appended to a log file
//!   (`--log-file`), for tests and tools: see [`Record`] for the fields.
//!
//! ## Usage
//!
//! ```sh
//! nri-logger --socket-path /var/run/nri/nri.sock --idx 99 --events all --log-file /tmp/nri-events.jsonl
//! ```
//!
//! | flag | default | what |
//! |---|---|---|
//! | `--socket-path PATH` | `/var/run/nri/nri.sock` | the runtime's NRI socket (ignored when the runtime launched the plugin) |
//! | `--idx NN` | `NRI_PLUGIN_IDX`, an `IDX-NAME` executable name, else `99` | plugin index: with `99` the logger runs last and sees containers as the other plugins adjusted them |
//! | `--name NAME` | `NRI_PLUGIN_NAME`, an `IDX-NAME` executable name, else the executable's name | plugin name |
//! | `--events LIST` | `all` | events to subscribe to, in [`nri_stub::EventMask::parse`] syntax (`CreateContainer,stop_container`, `pod`, `container`, `all`) |
//! | `--log-file PATH` | none | also append JSON lines here |
//!
//! Installed as a pre-installed plugin (e.g. `/opt/nri/plugins/99-logger`),
//! the runtime passes no flags; a drop-in configuration
//! (`/etc/nri/conf.d/99-logger.conf`) may set the same two options in TOML
//! ([`LoggerConfig`]), and takes precedence over the flags:
//!
//! ```toml
//! events = "pod,CreateContainer"
//! log_file = "/var/log/nri-events.jsonl"
//! ```

#![warn(missing_docs)]

use std::path::PathBuf;

use nri_stub::EventMask;
use serde::Deserialize;

pub use self::{
    plugin::Logger,
    record::{ContainerRef, PodRef, Record, resources_summary},
};

mod plugin;
mod record;

/// Why the logger could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggerError {
    /// The JSON-lines log file cannot be opened for appending.
    #[error("cannot open log file {path}")]
    LogFile {
        /// The path given.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The drop-in configuration is not valid TOML or has an unknown key:
    /// the parser's message, on one line, after the line number and the
    /// line's text when the parser located it (`line 1 \`colour = "red"\`:
    /// unknown field \`colour\`, expected ...`).
    #[error("invalid nri-logger configuration: {0}")]
    Config(String),
    /// The `events` list names an unknown event.
    #[error("invalid nri-logger configuration: events: {0}")]
    Events(nri_proto::events::EventError),
}

/// The configuration a runtime may pass in Configure (from its drop-in
/// directory, for a pre-installed logger), in TOML.
///
/// ```
/// let c = nri_logger::LoggerConfig::parse("events = \"pod\"\nlog_file = \"/tmp/x.jsonl\"").unwrap();
/// assert_eq!(c.events.as_deref(), Some("pod"));
/// assert!(nri_logger::LoggerConfig::parse("colour = \"red\"").unwrap_err().to_string().contains("colour"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggerConfig {
    /// Events to subscribe to ([`EventMask::parse`] syntax); replaces `--events`.
    pub events: Option<String>,
    /// JSON-lines log file; replaces `--log-file`.
    pub log_file: Option<PathBuf>,
}

/// A TOML error as one log line: toml's own Display draws the source line
/// and a caret over several lines, which a plugin's log (and the runtime's,
/// which shows a failed Configure's text) would split.
fn one_line(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim().replace('\n', "; ");
    let Some(start) = e.span().map(|s| s.start).filter(|s| text.is_char_boundary(*s)) else {
        return message;
    };
    let line = text[..start].matches('\n').count() + 1;
    match text.lines().nth(line - 1).map(str::trim).filter(|t| !t.is_empty()) {
        Some(t) => format!("line {line} `{t}`: {message}"),
        None => format!("line {line}: {message}"),
    }
}

impl LoggerConfig {
    /// Parses the TOML text; an empty text is the empty configuration.
    ///
    /// # Errors
    /// [`LoggerError::Config`] (naming the offending key) or
    /// [`LoggerError::Events`].
    pub fn parse(text: &str) -> Result<LoggerConfig, LoggerError> {
        let cfg: LoggerConfig = toml::from_str(text).map_err(|e| LoggerError::Config(one_line(text, &e)))?;
        if let Some(e) = &cfg.events {
            EventMask::parse(e).map_err(LoggerError::Events)?;
        }
        Ok(cfg)
    }

    /// The subscription this configuration asks for, if any.
    ///
    /// # Errors
    /// [`LoggerError::Events`].
    pub fn event_mask(&self) -> Result<Option<EventMask>, LoggerError> {
        Ok(match &self.events {
            Some(e) => Some(EventMask::parse(e).map_err(LoggerError::Events)?),
            None => None,
        })
    }
}

#[cfg(test)]
mod tests;
