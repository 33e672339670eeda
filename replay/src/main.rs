//! `nri-replay`: see the crate docs (`replay/src/lib.rs`).

use std::{
    path::PathBuf,
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
    /// Launch pre-installed plugins (IDX-NAME executables) from this directory.
    #[arg(long)]
    plugin_path: Option<PathBuf>,
    /// Drop-in configuration for pre-installed plugins.
    #[arg(long)]
    plugin_config_path: Option<PathBuf>,
    /// Wait until this many plugins are registered before replaying.
    #[arg(long, default_value_t = 0)]
    wait_plugins: usize,
    /// How long to wait for them, in seconds.
    #[arg(long, default_value_t = 10.0)]
    wait_timeout: f64,
    /// Per-request plugin timeout, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    request_timeout: u64,
    /// Plugins (NAME or IDX-NAME) the default validator requires; enables it.
    #[arg(long = "require-plugin")]
    required_plugins: Vec<String>,
    /// The scenario file (JSON).
    scenario: PathBuf,
}

async fn run(args: Args) -> anyhow::Result<bool> {
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
    let deadline = Instant::now() + Duration::from_secs_f64(args.wait_timeout);
    while nri.plugin_names().len() < args.wait_plugins {
        if Instant::now() > deadline {
            let have = nri.plugin_names();
            nri.stop().await;
            bail!(
                "only {} of {} plugins registered within {}s: {:?}",
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
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .init();
    let args = Args::parse();
    match run(args).await {
        Ok(true) => std::process::exit(0),
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("nri-replay: {e:#}");
            std::process::exit(1);
        }
    }
}
