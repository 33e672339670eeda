//! `nri-logger`: see the crate docs (`plugins/logger/src/lib.rs`).

use std::{path::PathBuf, sync::Arc};

use anyhow::Context as _;
use clap::Parser;
use nri_logger::Logger;
use nri_stub::{EventMask, Stub, cli};

/// Index used when neither `--idx`, `NRI_PLUGIN_IDX` nor an `IDX-NAME`
/// executable name gives one: last, so the logger sees containers as the
/// other plugins adjusted them.
const DEFAULT_IDX: &str = "99";

/// NRI plugin that logs every pod and container event it receives.
#[derive(Parser, Debug)]
#[command(name = "nri-logger", version)]
struct Args {
    #[command(flatten)]
    plugin: cli::PluginArgs,
    /// Events to subscribe to: comma-separated names (RunPodSandbox,
    /// create_container, ...) or the groups pod, container, validate, all.
    #[arg(long, default_value = "all")]
    events: String,
    /// Also append one JSON object per event to this file.
    #[arg(long)]
    log_file: Option<PathBuf>,
}

async fn run(args: Args) -> anyhow::Result<()> {
    let events = EventMask::parse(&args.events).with_context(|| format!("invalid --events {:?}", args.events))?;
    let logger = match &args.log_file {
        Some(path) => Logger::with_log_file(path)?,
        None => Logger::new(),
    };
    let builder = Stub::builder_arc(Arc::new(logger))
        .with_events(events)
        .with_default_plugin_idx(DEFAULT_IDX);
    Ok(cli::serve(args.plugin.apply(builder)).await?)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    cli::init_logging();
    cli::exit_on_error("nri-logger", run(Args::parse()).await);
}
