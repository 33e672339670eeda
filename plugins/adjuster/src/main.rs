//! `nri-adjuster`: see the crate docs (`plugins/adjuster/src/lib.rs`).

use std::{path::PathBuf, sync::Arc};

use anyhow::Context as _;
use clap::Parser;
use nri_adjuster::{Adjuster, Config};
use nri_stub::{Stub, cli};

/// Index used when neither `--idx`, `NRI_PLUGIN_IDX` nor an `IDX-NAME`
/// executable name gives one.
const DEFAULT_IDX: &str = "10";

/// NRI plugin that adjusts matching containers as declared in a TOML file.
#[derive(Parser, Debug)]
#[command(name = "nri-adjuster", version)]
struct Args {
    #[command(flatten)]
    plugin: cli::PluginArgs,
    /// The rules (TOML). A configuration sent by the runtime takes precedence.
    #[arg(long)]
    config: Option<PathBuf>,
}

async fn run(args: Args) -> anyhow::Result<()> {
    let config = match &args.config {
        Some(path) => Config::from_file(path).with_context(|| format!("--config {}", path.display()))?,
        None => Config::default(),
    };
    let builder = Stub::builder_arc(Arc::new(Adjuster::new(config)))
        .with_events(nri_adjuster::events())
        .with_default_plugin_idx(DEFAULT_IDX);
    Ok(cli::serve(args.plugin.apply(builder)).await?)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    cli::init_logging();
    cli::exit_on_error("nri-adjuster", run(Args::parse()).await);
}
