//! A template NRI plugin: copy this crate to start your own.
//!
//! It subscribes to CreateContainer and adjusts every container it is told
//! about: the annotation `example.com/seen-by`, and the environment
//! variable its configuration names. The configuration is the text the
//! runtime sends at Configure: for a pre-installed plugin, the drop-in
//! file `<plugin_config_path>/IDX-NAME.conf` (or `NAME.conf`); here one
//! line `KEY=VALUE`.
//!
//! Run it by hand against a runtime's socket
//! (`nri-plugin-template --socket-path /var/run/nri/nri.sock`), or install
//! it as `<plugin_path>/50-template` for the runtime to launch; test it
//! with nri-replay (see nri-shim's docs/plugin-authors.md, "Test it with
//! nri-replay").

use std::sync::Mutex;

use clap::Parser;
use nri_stub::{BoxError, EventMask, Plugin, Stub, api, cli};

/// The plugin's state: what Configure set.
#[derive(Default)]
struct Template {
    /// The environment variable to add, from the configuration.
    env: Mutex<Option<(String, String)>>,
}

#[nri_stub::async_trait]
impl Plugin for Template {
    async fn configure(&self, req: &api::ConfigureRequest) -> Result<EventMask, BoxError> {
        let config = req.config.trim();
        if !config.is_empty() {
            // An error here fails the plugin's start: the runtime logs it.
            let (key, value) = config
                .split_once('=')
                .ok_or_else(|| format!("configuration {config:?}: want KEY=VALUE"))?;
            *self.env.lock().unwrap() = Some((key.to_string(), value.to_string()));
        }
        tracing::info!(runtime = %req.runtime_name, version = %req.runtime_version, "configured");
        // Empty: keep the events the stub was built with (see `main`).
        Ok(EventMask::default())
    }

    async fn create_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
    ) -> Result<api::CreateContainerResponse, BoxError> {
        let mut rsp = api::CreateContainerResponse::new();
        // `adjust` is a MessageField: `mut_or_insert_default` creates it.
        let adjust = rsp.adjust.mut_or_insert_default();
        adjust
            .annotations
            .insert("example.com/seen-by".into(), "nri-plugin-template".into());
        if let Some((key, value)) = self.env.lock().unwrap().clone() {
            adjust.env.push(api::KeyValue {
                key,
                value,
                ..Default::default()
            });
        }
        tracing::info!(pod = %pod.name, container = %container.name, "adjusted");
        Ok(rsp)
    }
}

/// `--socket-path`, `--idx`, `--name` (a pre-installed plugin gets them
/// from the runtime instead).
#[derive(Parser)]
#[command(name = "nri-plugin-template", version)]
struct Args {
    #[command(flatten)]
    plugin: cli::PluginArgs,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // The stub logs registration and shutdown through `tracing`: without a
    // subscriber those lines are lost. RUST_LOG sets the filter (info by default).
    cli::init_logging();
    let args = Args::parse();
    let builder = Stub::builder(Template::default())
        .with_events(EventMask::parse("CreateContainer").expect("a valid event list"))
        .with_default_plugin_idx("50");
    cli::exit_on_error("nri-plugin-template", cli::serve(args.plugin.apply(builder)).await);
}
