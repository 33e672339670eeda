//! The plugin process of the benchmarks: answers CreateContainer with an
//! empty response or with slot `--slot N`'s adjustment.
//! Usage: `nri-bench-plugin --socket PATH --idx NN --name NAME [--slot N]`.
//!
//! `nri-bench-plugin --echo PATH` is the floor of `dispatch`: it connects to
//! PATH and answers every length-prefixed message with an empty one, no
//! ttrpc, protobuf or mux in between.

use nri_benches::BenchPlugin;
use nri_stub::{EventMask, Stub};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    if std::env::args().nth(1).as_deref() == Some("--echo") {
        let path = std::env::args().nth(2).expect("--echo PATH");
        if let Err(e) = nri_benches::echo(&path).await {
            eprintln!("nri-bench-plugin: echo: {e}");
        }
        return;
    }
    let (mut socket, mut idx, mut name, mut slot) = (None, None, None, None);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--socket" => socket = args.next(),
            "--idx" => idx = args.next(),
            "--name" => name = args.next(),
            "--slot" => slot = args.next().and_then(|s| s.parse().ok()),
            other => panic!("unknown argument {other}"),
        }
    }
    let mut b = Stub::builder(BenchPlugin::new(slot)).with_events(EventMask::parse("CreateContainer").unwrap());
    if let Some(s) = socket {
        b = b.with_socket_path(s);
    }
    if let Some(i) = idx {
        b = b.with_plugin_idx(i);
    }
    if let Some(n) = name {
        b = b.with_plugin_name(n);
    }
    if let Err(e) = b.build().expect("stub").run().await {
        eprintln!("nri-bench-plugin: {e}");
    }
}
