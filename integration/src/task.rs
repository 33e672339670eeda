//! A client of a shim's task service (containerd's `Task` ttrpc API) on
//! the shim's own socket: how the tests and benchmarks measure a shim's
//! answers without containerd in between.

use std::{path::Path, time::Duration};

use containerd_shim_protos::api;
use protobuf::Message;

/// The ttrpc metadata key containerd puts its namespace under.
pub const NAMESPACE_HEADER: &str = "containerd-namespace-ttrpc";

/// A connection to one shim's task service.
pub struct TaskClient {
    client: ttrpc::asynchronous::Client,
    namespace: String,
    /// `containerd.task.v2.Task` (containerd 1.x) or `containerd.task.v3.Task`
    /// (2.x).
    service: &'static str,
}

impl TaskClient {
    /// Connects to the socket `addr` (a path, or `unix://` with one) as
    /// containerd of major version `major` would, in `namespace`.
    ///
    /// # Panics
    /// When the socket does not answer.
    pub async fn connect(addr: &str, namespace: &str, major: u32) -> TaskClient {
        let addr = if addr.contains("://") {
            addr.to_string()
        } else {
            format!("unix://{addr}")
        };
        let client = ttrpc::asynchronous::Client::connect(&addr)
            .await
            .unwrap_or_else(|e| panic!("connect to the shim at {addr}: {e}"));
        TaskClient {
            client,
            namespace: namespace.into(),
            service: if major >= 2 {
                "containerd.task.v3.Task"
            } else {
                "containerd.task.v2.Task"
            },
        }
    }

    /// One call: `method` with `req`; the ttrpc status when it failed.
    async fn call(&self, method: &str, req: &impl Message) -> Result<Vec<u8>, String> {
        let mut ctx = ttrpc::context::with_timeout(Duration::from_secs(20).as_nanos() as i64);
        ctx.add(NAMESPACE_HEADER.into(), self.namespace.clone());
        let call = ttrpc::proto::Request {
            service: self.service.into(),
            method: method.into(),
            timeout_nano: ctx.timeout_nano,
            metadata: ttrpc::context::to_pb(ctx.metadata),
            payload: req.write_to_bytes().expect("encode"),
            ..Default::default()
        };
        let res = self.client.request(call).await.map_err(|e| format!("{method}: {e}"))?;
        match res.status.as_ref() {
            Some(s) if s.code() != ttrpc::Code::OK => Err(format!("{method}: {:?} {}", s.code(), s.message)),
            _ => Ok(res.payload),
        }
    }

    /// Task.State of `id`.
    ///
    /// # Errors
    /// The call's failure.
    pub async fn state(&self, id: &str) -> Result<api::StateResponse, String> {
        let req = api::StateRequest {
            id: id.into(),
            ..Default::default()
        };
        let bytes = self.call("State", &req).await?;
        api::StateResponse::parse_from_bytes(&bytes).map_err(|e| format!("State: {e}"))
    }

    /// Task.ResizePty of `id`'s init process.
    ///
    /// # Errors
    /// The call's failure.
    pub async fn resize_pty(&self, id: &str, width: u32, height: u32) -> Result<(), String> {
        let req = api::ResizePtyRequest {
            id: id.into(),
            width,
            height,
            ..Default::default()
        };
        self.call("ResizePty", &req).await.map(drop)
    }
}

/// The address containerd keeps for the shim of task `id` in namespace
/// `ns` under its state directory `state` (`address`, or the `address` of
/// containerd 2.x's `bootstrap.json`).
///
/// # Panics
/// When neither file is there.
pub fn shim_address(state: &Path, ns: &str, id: &str) -> String {
    let dir = state.join("io.containerd.runtime.v2.task").join(ns).join(id);
    if let Ok(a) = std::fs::read_to_string(dir.join("address")) {
        return a.trim().to_string();
    }
    let boot = std::fs::read_to_string(dir.join("bootstrap.json"))
        .unwrap_or_else(|e| panic!("no address or bootstrap.json in {}: {e}", dir.display()));
    let v: serde_json::Value = serde_json::from_str(&boot).expect("bootstrap.json is JSON");
    v["address"].as_str().expect("bootstrap.json address").to_string()
}
