//! `nri-replay`: see the crate docs (`replay/src/lib.rs`).

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use clap::Parser;
use nri_adaptation::{Adaptation, DefaultValidatorConfig};
use nri_replay::{ReplayState, load, replay, runtime_builder};

/// Replay a pod/container lifecycle scenario against real NRI plugins and
/// print one JSON line per step.
#[derive(Parser, Debug)]
#[command(name = "nri-replay", version)]
struct Args {
    /// Socket external plugins connect to.
    #[arg(long, default_value = nri_proto::DEFAULT_SOCKET_PATH)]
    socket_path: PathBuf,
    /// Launch pre-installed plugins (IDX-NAME executables) from this directory (must exist).
    #[arg(long)]
    plugin_path: Option<PathBuf>,
    /// Drop-in configuration for pre-installed plugins: a directory (must exist).
    #[arg(long)]
    plugin_config_path: Option<PathBuf>,
    /// Wait until this many plugins are registered before replaying.
    #[arg(long, default_value_t = 0)]
    wait_plugins: usize,
    /// How long to wait for them, in seconds (fractions allowed).
    #[arg(long, default_value = "10", value_parser = parse_seconds)]
    wait_timeout: Duration,
    /// Per-request plugin timeout, in milliseconds (at most a day).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=MAX_REQUEST_TIMEOUT_MS))]
    request_timeout: u64,
    /// Plugins (NAME or IDX-NAME) the default validator requires; enables it.
    #[arg(long = "require-plugin")]
    required_plugins: Vec<String>,
    /// The scenario file (JSON).
    scenario: PathBuf,
}

/// The longest `--request-timeout`: a day. The deadline travels to the
/// plugin in nanoseconds, as an i64.
const MAX_REQUEST_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;

/// A number of seconds, `0` or more: `10`, `0.5`, `1e3`.
fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !secs.is_finite() {
        return Err(format!("{s:?} is not a finite number of seconds"));
    }
    if secs < 0.0 {
        return Err(format!("{s:?} is negative: give a number of seconds, 0 or more"));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{s:?} seconds is too long"))
}

/// `path`, given with `flag`, must be a directory.
fn require_dir(flag: &str, path: &Path) -> anyhow::Result<()> {
    let meta = std::fs::metadata(path).with_context(|| format!("{flag} {}", path.display()))?;
    if !meta.is_dir() {
        bail!("{flag} {}: not a directory", path.display());
    }
    Ok(())
}

async fn run(args: Args) -> anyhow::Result<bool> {
    if let Some(p) = &args.plugin_path {
        require_dir("--plugin-path", p)?;
    }
    if let Some(p) = &args.plugin_config_path {
        require_dir("--plugin-config-path", p)?;
    }
    let loaded = load(&args.scenario)?;
    let state = Arc::new(Mutex::new(ReplayState::default()));
    let mut builder = Adaptation::builder("nri-replay", env!("CARGO_PKG_VERSION"))
        .with_socket_path(&args.socket_path)
        .with_request_timeout(Duration::from_millis(args.request_timeout));
    builder = match &args.plugin_path {
        Some(p) => builder.with_plugin_path(p),
        None => builder.with_plugin_path("/nonexistent/nri-replay/no-plugins"),
    };
    if let Some(p) = &args.plugin_config_path {
        builder = builder.with_plugin_config_path(p);
    }
    if !args.required_plugins.is_empty() {
        builder = builder.with_default_validator(DefaultValidatorConfig {
            required_plugins: args.required_plugins.clone(),
            ..Default::default()
        });
    }
    let nri = runtime_builder(builder, state.clone()).build()?;
    nri.start().await.context("starting the NRI adaptation")?;
    // No deadline when the wait is too long for the clock to represent.
    let deadline = Instant::now().checked_add(args.wait_timeout);
    while nri.plugin_names().len() < args.wait_plugins {
        if deadline.is_some_and(|d| Instant::now() > d) {
            let have = nri.plugin_names();
            nri.stop().await;
            bail!(
                "only {} of {} plugins registered within {:?}: {:?}",
                have.len(),
                args.wait_plugins,
                args.wait_timeout,
                have
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("nri-replay: plugins {:?}", nri.plugin_names());
    let (lines, ok) = replay(&nri, &state, &loaded).await;
    for l in lines {
        println!("{l}");
    }
    nri.stop().await;
    Ok(ok)
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal, not in a file, pipe or CI log.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .init();
    let args = Args::parse();
    match run(args).await {
        Ok(true) => std::process::exit(0),
        Ok(false) => std::process::exit(1),
        Err(e) => {
            // `{:#}`: the error and its causes, outermost first.
            eprintln!("nri-replay: {e:#}");
            std::process::exit(1);
        }
    }
}
