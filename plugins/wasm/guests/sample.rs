//! `sample`: behaves as upstream's `wasm` sample plugin (containerd/nri
//! `plugins/wasm`): every request is logged through `env.log` at info
//! level as `WASM: Got <request> request` and answered with the empty
//! message; an empty Configure answer subscribes it to every event.
//! Written here in Rust against the same calling convention, since the
//! Go original needs Go 1.24's `GOOS=wasip1 -buildmode=c-shared`, which
//! this project's build has no package for.

mod abi;
mod pb;

use abi::{log, Level, Request};

fn words(req: Request) -> &'static str {
    match req {
        Request::Configure => "configure",
        Request::Synchronize => "synchronize",
        Request::Shutdown => "shutdown",
        Request::RunPodSandbox => "run pod sandbox",
        Request::UpdatePodSandbox => "update pod sandbox",
        Request::PostUpdatePodSandbox => "post update pod sandbox",
        Request::StopPodSandbox => "stop pod sandbox",
        Request::RemovePodSandbox => "remove pod sandbox",
        Request::CreateContainer => "create container",
        Request::PostCreateContainer => "post create container",
        Request::StartContainer => "start container",
        Request::PostStartContainer => "post start container",
        Request::UpdateContainer => "update container",
        Request::PostUpdateContainer => "post update container",
        Request::StopContainer => "stop container",
        Request::RemoveContainer => "remove container",
        Request::StateChange => "state change",
        Request::ValidateContainerAdjustment => "validate container adjustment",
    }
}

pub fn handle(req: Request, _bytes: &[u8]) -> Result<Vec<u8>, String> {
    log(Level::Info, &format!("WASM: Got {} request", words(req)));
    Ok(Vec::new())
}
