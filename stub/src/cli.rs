//! What every plugin executable's `main` needs (feature `cli`): the flags
//! that place a plugin (`--socket-path`, `--idx`, `--name`), a log
//! subscriber that shows the stub's own log lines, and running the stub
//! until the runtime shuts it down.
//!
//! ```no_run
//! use clap::Parser;
//! use nri_stub::{Plugin, Stub, cli::PluginArgs};
//!
//! struct Noop;
//! impl Plugin for Noop {}
//!
//! #[derive(Parser)]
//! struct Args {
//!     #[command(flatten)]
//!     plugin: PluginArgs,
//! }
//!
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() {
//!     nri_stub::cli::init_logging();
//!     let args = Args::parse();
//!     let builder = args.plugin.apply(Stub::builder(Noop).with_default_plugin_idx("50"));
//!     nri_stub::cli::exit_on_error("my-plugin", nri_stub::cli::serve(builder).await);
//! }
//! ```

use std::path::PathBuf;

use crate::{StubBuilder, StubError};

/// The flags that place a plugin, to `#[command(flatten)]` into a clap
/// parser. A plugin launched by the runtime (pre-installed) ignores them:
/// the runtime gives it a connected socket, its index and name.
#[derive(clap::Args, Debug, Clone)]
pub struct PluginArgs {
    /// The runtime's NRI socket (ignored when launched by the runtime).
    #[arg(long, default_value = nri_proto::DEFAULT_SOCKET_PATH)]
    pub socket_path: PathBuf,
    /// Plugin index, two digits [default: NRI_PLUGIN_IDX, else the
    /// plugin's own default].
    #[arg(long)]
    pub idx: Option<String>,
    /// Plugin name [default: NRI_PLUGIN_NAME, else the executable's name].
    #[arg(long)]
    pub name: Option<String>,
}

impl PluginArgs {
    /// Sets the socket path, and the index and name when given.
    pub fn apply(self, mut builder: StubBuilder) -> StubBuilder {
        builder = builder.with_socket_path(&self.socket_path);
        if let Some(n) = self.name {
            builder = builder.with_plugin_name(n);
        }
        if let Some(i) = self.idx {
            builder = builder.with_plugin_idx(i);
        }
        builder
    }
}

/// Logs to stderr (where the runtime collects a pre-installed plugin's
/// output) with the filter in `RUST_LOG`, `info` by default: the stub's
/// own lines (registration, a runtime that went away) are at `info` and
/// `warn`. Colours only on a terminal.
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// A plugin run that failed: which plugin, and why.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The builder refused its settings (bad index or name, ...).
    #[error("invalid plugin settings")]
    Build(#[source] StubError),
    /// The plugin could not connect or register, or its connection failed.
    #[error("plugin {plugin}")]
    Run {
        /// `IDX-NAME`.
        plugin: String,
        /// What went wrong.
        #[source]
        source: StubError,
    },
}

/// Builds the stub and runs it until the runtime shuts the plugin down
/// (logged at `info`).
///
/// # Errors
/// [`ServeError`] naming the plugin.
pub async fn serve(builder: StubBuilder) -> Result<(), ServeError> {
    let stub = builder.build().map_err(ServeError::Build)?;
    let plugin = stub.qualified_name();
    stub.run().await.map_err(|source| ServeError::Run {
        plugin: plugin.clone(),
        source,
    })?;
    tracing::info!(plugin, "shut down by the runtime");
    Ok(())
}

/// Exits with status 1 after printing `PROGRAM: error: ERROR: CAUSE: ...`
/// (the error, then each [`source`](std::error::Error::source) in turn)
/// when `result` is an error.
pub fn exit_on_error<E: Into<Box<dyn std::error::Error + Send + Sync>>>(program: &str, result: Result<(), E>) {
    if let Err(e) = result {
        // `{:#}`: the error and its causes, outermost first.
        eprintln!("{program}: error: {:#}", anyhow::Error::from_boxed(e.into()));
        std::process::exit(1);
    }
}
