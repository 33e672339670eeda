//! `nri-adjuster`: see the crate docs (`plugins/adjuster/src/lib.rs`).

use std::{path::PathBuf, sync::Arc};

use anyhow::Context as _;
use clap::Parser;
use nri_adjuster::{Adjuster, Config};
use nri_stub::Stub;

/// Index used when neither `--idx`, `NRI_PLUGIN_IDX` nor an `IDX-NAME`
/// executable name gives one.
const DEFAULT_IDX: &str = "10";

/// NRI plugin that adjusts matching containers as declared in a TOML file.
#[derive(Parser, Debug)]
#[command(name = "nri-adjuster", version)]
struct Args {
    /// The runtime's NRI socket (ignored when launched by the runtime).
    #[arg(long, default_value = nri_proto::DEFAULT_SOCKET_PATH)]
    socket_path: PathBuf,
    /// Plugin index, two digits [default: NRI_PLUGIN_IDX, else 10].
    #[arg(long)]
    idx: Option<String>,
    /// Plugin name [default: NRI_PLUGIN_NAME, else the executable's name].
    #[arg(long)]
    name: Option<String>,
    /// The rules (TOML). A configuration sent by the runtime takes precedence.
    #[arg(long)]
    config: Option<PathBuf>,
}

async fn run(args: Args) -> anyhow::Result<()> {
    let config = match &args.config {
        Some(path) => Config::from_file(path).with_context(|| format!("--config {}", path.display()))?,
        None => Config::default(),
    };
    let mut builder = Stub::builder_arc(Arc::new(Adjuster::new(config)))
        .with_events(nri_adjuster::events())
        .with_socket_path(&args.socket_path)
        .with_default_plugin_idx(DEFAULT_IDX);
    if let Some(n) = args.name {
        builder = builder.with_plugin_name(n);
    }
    if let Some(i) = args.idx {
        builder = builder.with_plugin_idx(i);
    }
    let stub = builder.build()?;
    let plugin = stub.qualified_name();
    stub.run().await.with_context(|| format!("plugin {plugin}"))?;
    tracing::info!(plugin, "shut down by the runtime");
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
    let args = Args::parse();
    if let Err(e) = run(args).await {
        eprintln!("nri-adjuster: error: {}", nri_stub::error_chain(e.as_ref()));
        std::process::exit(1);
    }
}
