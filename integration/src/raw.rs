//! A "raw" NRI plugin written directly against `nri_proto` (mux + ttrpc), for
//! tests in which a plugin must misbehave at the protocol level: echo the
//! wrong `more` in a split sync, put updates into an intermediate sync reply,
//! answer the dedicated event RPCs like a pre-v0.12 plugin, register twice,
//! never register, or speak a bad name.
//!
//! It connects to the runtime's real socket exactly like `nri-stub` does:
//! conn 1 ([`PLUGIN_SERVICE_CONN`]) serves the `Plugin` service, conn 2
//! ([`RUNTIME_SERVICE_CONN`]) carries a `RuntimeClient`.

use std::{
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use nri_proto::{
    api::{self, Event},
    api_ttrpc,
    events::{EventMask, event_name},
    mux::{Mux, MuxError, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN},
    transport,
};
use tokio::net::UnixStream;
use ttrpc::asynchronous::{Server, TtrpcContext};

/// How a raw plugin answers Synchronize requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncReply {
    /// Like a v0.7+ plugin: echo `more`; updates only in the reply to the
    /// final (`more = false`) request.
    #[default]
    Split,
    /// Like a pre-v0.7 plugin: always `more = false` and the updates.
    AlwaysMoreFalse,
    /// Echo `more`, but put the updates into every reply, intermediate ones too.
    UpdatesInEveryReply,
}

/// How a raw plugin answers the nine dedicated notification RPCs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EventRpcs {
    /// Implemented (v0.12+ plugin).
    #[default]
    Dedicated,
    /// Answered with gRPC Unimplemented, like an old Go plugin (pre-v0.12).
    Unimplemented,
    /// Answered with NOT_FOUND "... is not supported", like a ttrpc-rust
    /// server without the method.
    NotSupported,
}

/// What a raw plugin does.
#[derive(Debug, Clone, Default)]
pub struct RawBehaviour {
    /// Events answered in Configure (0 = every event).
    pub events: EventMask,
    /// Synchronize replies.
    pub sync: SyncReply,
    /// Updates returned from Synchronize (see [`SyncReply`] for when).
    pub sync_updates: Vec<api::ContainerUpdate>,
    /// Dedicated event RPCs or the legacy StateChange only.
    pub event_rpcs: EventRpcs,
    /// Time to sit on every Synchronize request before replying (it is
    /// recorded on arrival).
    pub sync_delay: Option<Duration>,
}

/// One request a raw plugin received (and, for Synchronize, its reply).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Seen {
    /// RPC name, e.g. `Synchronize`, `CreateContainer`, `StateChange`.
    pub method: String,
    /// Whether the plugin refused it as unimplemented.
    pub refused: bool,
    /// Pod id, if any.
    pub pod: String,
    /// Container id, if any.
    pub container: String,
    /// Synchronize: pod ids in this request.
    pub pods: Vec<String>,
    /// Synchronize: container ids in this request.
    pub containers: Vec<String>,
    /// Synchronize: the request's `more`.
    pub more: bool,
    /// Synchronize: the reply's `more`.
    pub reply_more: bool,
    /// Synchronize: number of updates in the reply.
    pub reply_updates: usize,
    /// StateChange: the event carried.
    pub state_event: Option<Event>,
}

/// What a raw plugin received, shared with the test.
#[derive(Debug, Default)]
pub struct Recorder {
    seen: Mutex<Vec<Seen>>,
}

impl Recorder {
    fn push(&self, s: Seen) {
        self.seen.lock().unwrap().push(s);
    }

    /// Everything so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Requests of one method.
    pub fn of(&self, method: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.method == method).collect()
    }

    /// Waits until `pred` holds (polling; 20 s deadline).
    ///
    /// # Panics
    /// When the deadline passes, with what was seen.
    pub async fn wait_for(&self, what: &str, pred: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let seen = self.seen();
            if pred(&seen) {
                return seen;
            }
            if Instant::now() > deadline {
                panic!("timed out waiting for {what}; raw plugin saw:\n{seen:#?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The `Plugin` service of a raw plugin.
pub struct RawService {
    behaviour: RawBehaviour,
    recorder: Arc<Recorder>,
}

impl RawService {
    /// A service acting out `behaviour`, recording into `recorder`.
    pub fn new(behaviour: RawBehaviour, recorder: Arc<Recorder>) -> Arc<RawService> {
        Arc::new(RawService { behaviour, recorder })
    }

    /// Records a notification event and answers it, or refuses it when the
    /// plugin plays an old one.
    fn notification(
        &self,
        event: Event,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
    ) -> ttrpc::Result<()> {
        let method = event_name(event).to_string();
        let refusal = match self.behaviour.event_rpcs {
            EventRpcs::Dedicated => None,
            EventRpcs::Unimplemented => Some(ttrpc::get_status(
                ttrpc::Code::UNIMPLEMENTED,
                format!("unknown method {method}"),
            )),
            EventRpcs::NotSupported => Some(ttrpc::get_status(
                ttrpc::Code::NOT_FOUND,
                format!("/nri.pkg.api.v1alpha1.Plugin/{method} is not supported"),
            )),
        };
        self.recorder.push(Seen {
            method,
            refused: refusal.is_some(),
            pod: pod.id.clone(),
            container: container.map(|c| c.id.clone()).unwrap_or_default(),
            ..Default::default()
        });
        match refusal {
            Some(st) => Err(ttrpc::Error::RpcStatus(st)),
            None => Ok(()),
        }
    }
}

#[async_trait]
impl api_ttrpc::Plugin for RawService {
    async fn configure(
        &self,
        _ctx: &TtrpcContext,
        _req: api::ConfigureRequest,
    ) -> ttrpc::Result<api::ConfigureResponse> {
        self.recorder.push(Seen {
            method: "Configure".into(),
            ..Default::default()
        });
        Ok(api::ConfigureResponse {
            events: self.behaviour.events.bits(),
            ..Default::default()
        })
    }

    async fn synchronize(
        &self,
        _ctx: &TtrpcContext,
        req: api::SynchronizeRequest,
    ) -> ttrpc::Result<api::SynchronizeResponse> {
        let updates = self.behaviour.sync_updates.clone();
        let rsp = match self.behaviour.sync {
            SyncReply::Split if req.more => api::SynchronizeResponse {
                more: true,
                ..Default::default()
            },
            SyncReply::Split | SyncReply::AlwaysMoreFalse => api::SynchronizeResponse {
                update: updates,
                more: false,
                ..Default::default()
            },
            SyncReply::UpdatesInEveryReply => api::SynchronizeResponse {
                update: updates,
                more: req.more,
                ..Default::default()
            },
        };
        self.recorder.push(Seen {
            method: "Synchronize".into(),
            pods: req.pods.iter().map(|p| p.id.clone()).collect(),
            containers: req.containers.iter().map(|c| c.id.clone()).collect(),
            more: req.more,
            reply_more: rsp.more,
            reply_updates: rsp.update.len(),
            ..Default::default()
        });
        if let Some(d) = self.behaviour.sync_delay {
            tokio::time::sleep(d).await;
        }
        Ok(rsp)
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: api::Empty) -> ttrpc::Result<api::Empty> {
        self.recorder.push(Seen {
            method: "Shutdown".into(),
            ..Default::default()
        });
        Ok(api::Empty::new())
    }

    async fn run_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::RunPodSandboxRequest,
    ) -> ttrpc::Result<api::RunPodSandboxResponse> {
        self.notification(Event::RUN_POD_SANDBOX, req.pod.get_or_default(), None)?;
        Ok(Default::default())
    }

    async fn post_update_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostUpdatePodSandboxRequest,
    ) -> ttrpc::Result<api::PostUpdatePodSandboxResponse> {
        self.notification(Event::POST_UPDATE_POD_SANDBOX, req.pod.get_or_default(), None)?;
        Ok(Default::default())
    }

    async fn stop_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::StopPodSandboxRequest,
    ) -> ttrpc::Result<api::StopPodSandboxResponse> {
        self.notification(Event::STOP_POD_SANDBOX, req.pod.get_or_default(), None)?;
        Ok(Default::default())
    }

    async fn remove_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::RemovePodSandboxRequest,
    ) -> ttrpc::Result<api::RemovePodSandboxResponse> {
        self.notification(Event::REMOVE_POD_SANDBOX, req.pod.get_or_default(), None)?;
        Ok(Default::default())
    }

    async fn create_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::CreateContainerRequest,
    ) -> ttrpc::Result<api::CreateContainerResponse> {
        self.recorder.push(Seen {
            method: "CreateContainer".into(),
            pod: req.pod.id.clone(),
            container: req.container.id.clone(),
            ..Default::default()
        });
        Ok(Default::default())
    }

    async fn post_create_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostCreateContainerRequest,
    ) -> ttrpc::Result<api::PostCreateContainerResponse> {
        self.notification(
            Event::POST_CREATE_CONTAINER,
            req.pod.get_or_default(),
            req.container.as_ref(),
        )?;
        Ok(Default::default())
    }

    async fn start_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::StartContainerRequest,
    ) -> ttrpc::Result<api::StartContainerResponse> {
        self.notification(Event::START_CONTAINER, req.pod.get_or_default(), req.container.as_ref())?;
        Ok(Default::default())
    }

    async fn post_start_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostStartContainerRequest,
    ) -> ttrpc::Result<api::PostStartContainerResponse> {
        self.notification(
            Event::POST_START_CONTAINER,
            req.pod.get_or_default(),
            req.container.as_ref(),
        )?;
        Ok(Default::default())
    }

    async fn update_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::UpdateContainerRequest,
    ) -> ttrpc::Result<api::UpdateContainerResponse> {
        self.recorder.push(Seen {
            method: "UpdateContainer".into(),
            pod: req.pod.id.clone(),
            container: req.container.id.clone(),
            ..Default::default()
        });
        Ok(Default::default())
    }

    async fn post_update_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostUpdateContainerRequest,
    ) -> ttrpc::Result<api::PostUpdateContainerResponse> {
        self.notification(
            Event::POST_UPDATE_CONTAINER,
            req.pod.get_or_default(),
            req.container.as_ref(),
        )?;
        Ok(Default::default())
    }

    async fn stop_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::StopContainerRequest,
    ) -> ttrpc::Result<api::StopContainerResponse> {
        self.recorder.push(Seen {
            method: "StopContainer".into(),
            pod: req.pod.id.clone(),
            container: req.container.id.clone(),
            ..Default::default()
        });
        Ok(Default::default())
    }

    async fn remove_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::RemoveContainerRequest,
    ) -> ttrpc::Result<api::RemoveContainerResponse> {
        self.notification(
            Event::REMOVE_CONTAINER,
            req.pod.get_or_default(),
            req.container.as_ref(),
        )?;
        Ok(Default::default())
    }

    async fn state_change(&self, _ctx: &TtrpcContext, req: api::StateChangeEvent) -> ttrpc::Result<api::Empty> {
        self.recorder.push(Seen {
            method: "StateChange".into(),
            pod: req.pod.id.clone(),
            container: req.container.id.clone(),
            state_event: req.event.enum_value().ok(),
            ..Default::default()
        });
        Ok(api::Empty::new())
    }
}

/// One raw connection to the runtime: the mux, the Plugin service served on
/// conn 1 and a Runtime client on conn 2. Dropping it closes the trunk.
pub struct RawConn {
    /// The trunk.
    pub mux: Mux,
    /// Client of the runtime's `Runtime` service.
    pub runtime: api_ttrpc::RuntimeClient,
    _server: Server,
}

impl RawConn {
    /// Dials `socket` and serves `service` (not registered yet).
    ///
    /// # Panics
    /// When the socket cannot be dialled.
    pub async fn connect(socket: &Path, service: Arc<dyn api_ttrpc::Plugin + Send + Sync>) -> RawConn {
        Self::connect_with_preamble(socket, &[], service).await
    }

    /// Like [`RawConn::connect`], but first writes `preamble` raw onto the
    /// socket (e.g. frames for connection ids nobody opened).
    ///
    /// # Panics
    /// When the socket cannot be dialled or written.
    pub async fn connect_with_preamble(
        socket: &Path,
        preamble: &[u8],
        service: Arc<dyn api_ttrpc::Plugin + Send + Sync>,
    ) -> RawConn {
        use tokio::io::AsyncWriteExt as _;
        let mut stream = UnixStream::connect(socket)
            .await
            .unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
        stream.write_all(preamble).await.expect("write preamble");
        let mux = Mux::blocked(stream);
        let plugin_conn = mux.open(PLUGIN_SERVICE_CONN).expect("open conn 1");
        let runtime_conn = mux.open(RUNTIME_SERVICE_CONN).expect("open conn 2");
        let mut server = Server::new()
            .add_listener(transport::listener(plugin_conn))
            .register_service(api_ttrpc::create_plugin(service));
        server.start().await.expect("start raw plugin server");
        mux.unblock();
        let runtime = api_ttrpc::RuntimeClient::new(transport::client(runtime_conn));
        RawConn {
            mux,
            runtime,
            _server: server,
        }
    }

    /// Sends RegisterPlugin.
    ///
    /// # Errors
    /// The runtime's refusal or a transport error.
    pub async fn register(&self, idx: &str, name: &str) -> ttrpc::Result<()> {
        let req = api::RegisterPluginRequest {
            plugin_name: name.into(),
            plugin_idx: idx.into(),
            NRI_version: nri_proto::NRI_VERSION.into(),
            ..Default::default()
        };
        let ctx = ttrpc::context::with_timeout(Duration::from_secs(5).as_nanos() as i64);
        self.runtime.register_plugin(ctx, &req).await.map(|_| ())
    }

    /// Sends UpdateContainers and returns the failed updates.
    ///
    /// # Errors
    /// The runtime's error or a transport error.
    pub async fn update_containers(
        &self,
        update: Vec<api::ContainerUpdate>,
    ) -> ttrpc::Result<Vec<api::ContainerUpdate>> {
        let req = api::UpdateContainersRequest {
            update,
            ..Default::default()
        };
        let ctx = ttrpc::context::with_timeout(Duration::from_secs(5).as_nanos() as i64);
        self.runtime.update_containers(ctx, &req).await.map(|r| r.failed)
    }

    /// Whether the trunk is closed.
    pub fn is_closed(&self) -> bool {
        self.mux.is_closed()
    }

    /// Waits until the runtime closes the connection (20 s deadline).
    ///
    /// # Panics
    /// When it is still open at the deadline.
    pub async fn wait_closed(&self) -> Option<Arc<MuxError>> {
        tokio::time::timeout(Duration::from_secs(20), self.mux.closed())
            .await
            .expect("the runtime did not close the raw plugin's connection")
    }
}

impl Drop for RawConn {
    fn drop(&mut self) {
        self.mux.close();
    }
}

/// A raw plugin that connected and registered as `idx-name`.
pub struct RawPlugin {
    /// The connection.
    pub conn: RawConn,
    /// What it received.
    pub recorder: Arc<Recorder>,
}

impl RawPlugin {
    /// Connects to `socket`, serves `behaviour` and registers as `idx-name`.
    ///
    /// # Panics
    /// When the connection or the registration fails.
    pub async fn start(socket: &Path, idx: &str, name: &str, behaviour: RawBehaviour) -> Self {
        let recorder = Arc::new(Recorder::default());
        let conn = RawConn::connect(socket, RawService::new(behaviour, recorder.clone())).await;
        conn.register(idx, name)
            .await
            .unwrap_or_else(|e| panic!("raw plugin {idx}-{name} failed to register: {e:?}"));
        RawPlugin { conn, recorder }
    }
}

/// One mux frame: 8-byte header (conn id, length; big endian) and payload.
pub fn frame(conn_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&conn_id.to_be_bytes());
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Reads `stream` until the peer closes it (EOF or reset); returns what was
/// read. Bounded by `within`.
///
/// # Panics
/// When the peer keeps the connection open past `within`.
pub async fn read_until_closed(stream: &mut UnixStream, within: Duration) -> Vec<u8> {
    use tokio::io::AsyncReadExt as _;
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(within, read)
        .await
        .unwrap_or_else(|_| panic!("the runtime kept the connection open for {within:?}"));
    got
}

/// The `Plugin` service name on the wire.
const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
/// The `Runtime` service name on the wire.
const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";

/// One ttrpc message (10-byte header and payload) as bytes.
pub fn ttrpc_message(stream_id: u32, kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(10 + payload.len());
    m.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    m.extend_from_slice(&stream_id.to_be_bytes());
    m.extend_from_slice(&[kind, 0]);
    m.extend_from_slice(payload);
    m
}

/// One ttrpc message as a bare plugin reads it.
struct WireMessage {
    /// The logical connection it came on.
    conn: u32,
    /// ttrpc message type (request, response, data).
    kind: u8,
    stream_id: u32,
    payload: Vec<u8>,
}

/// A plugin that speaks the wire protocol by hand over a plain blocking
/// socket: no mux task and no ttrpc runtime reads for it, so a test
/// decides when it reads at all (or never again), and what it writes
/// (well-formed requests at any rate, or garbage) goes out as is.
///
/// It serves the `Plugin` service only as far as joining needs (Configure,
/// Synchronize, Shutdown; every other request gets an empty answer).
pub struct BarePlugin {
    /// The socket to the runtime.
    pub stream: std::os::unix::net::UnixStream,
    /// Unparsed bytes per logical connection.
    pending: std::collections::HashMap<u32, Vec<u8>>,
    next_stream: u32,
    events: EventMask,
}

impl BarePlugin {
    /// Dials `socket`, registers as `idx-name` subscribing to `events` and
    /// answers the runtime until it is synchronized (within `within`).
    ///
    /// # Panics
    /// When the socket fails or the runtime does not synchronize the plugin in time.
    pub fn join(socket: &Path, idx: &str, name: &str, events: EventMask, within: Duration) -> BarePlugin {
        let stream = std::os::unix::net::UnixStream::connect(socket)
            .unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
        let mut p = BarePlugin {
            stream,
            pending: Default::default(),
            next_stream: 1,
            events,
        };
        let req = api::RegisterPluginRequest {
            plugin_name: name.into(),
            plugin_idx: idx.into(),
            NRI_version: nri_proto::NRI_VERSION.into(),
            ..Default::default()
        };
        let bytes = p.request("RegisterPlugin", &req);
        p.write(&bytes).expect("write RegisterPlugin");
        let deadline = Instant::now() + within;
        p.serve_until(deadline, |method, req| {
            method == "Synchronize"
                && <api::SynchronizeRequest as protobuf::Message>::parse_from_bytes(&req.payload).is_ok_and(|s| !s.more)
        })
        .unwrap_or_else(|e| panic!("bare plugin {idx}-{name} was not synchronized: {e}"));
        p
    }

    /// A mux frame on conn 2 carrying a ttrpc request of the `Runtime`
    /// service with a fresh stream id (sent by [`BarePlugin::write`]).
    pub fn request(&mut self, method: &str, msg: &impl protobuf::Message) -> Vec<u8> {
        let req = ttrpc::Request {
            service: RUNTIME_SERVICE.into(),
            method: method.into(),
            payload: msg.write_to_bytes().expect("encode"),
            ..Default::default()
        };
        let id = self.next_stream;
        self.next_stream += 2;
        let body = protobuf::Message::write_to_bytes(&req).expect("encode ttrpc request");
        frame(
            RUNTIME_SERVICE_CONN,
            &ttrpc_message(id, ttrpc::proto::MESSAGE_TYPE_REQUEST, &body),
        )
    }

    /// Writes `bytes` onto the socket as they are.
    ///
    /// # Errors
    /// The socket's (EPIPE, ECONNRESET once the runtime closed it).
    pub fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        use std::io::Write as _;
        self.stream.write_all(bytes)
    }

    /// Reads and answers the runtime's requests until `done(method,
    /// request)` holds for one that was just answered, or `deadline`.
    ///
    /// # Errors
    /// The socket closed, or the deadline passed.
    pub fn serve_until(
        &mut self,
        deadline: Instant,
        mut done: impl FnMut(&str, &ttrpc::Request) -> bool,
    ) -> std::io::Result<()> {
        use std::io::Read as _;
        loop {
            while let Some(msg) = self.next_message() {
                if msg.conn != PLUGIN_SERVICE_CONN || msg.kind != ttrpc::proto::MESSAGE_TYPE_REQUEST {
                    continue; // answers to our own requests, ignored
                }
                let stream_id = msg.stream_id;
                let req: ttrpc::Request =
                    protobuf::Message::parse_from_bytes(&msg.payload).map_err(std::io::Error::other)?;
                let payload = self.answer(&req)?;
                let rsp = ttrpc::Response {
                    payload,
                    ..Default::default()
                };
                let body = protobuf::Message::write_to_bytes(&rsp).expect("encode ttrpc response");
                let bytes = frame(
                    PLUGIN_SERVICE_CONN,
                    &ttrpc_message(stream_id, ttrpc::proto::MESSAGE_TYPE_RESPONSE, &body),
                );
                self.write(&bytes)?;
                if done(&req.method, &req) {
                    return Ok(());
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            self.stream.set_read_timeout(Some(left))?;
            let mut header = [0u8; 8];
            self.stream.read_exact(&mut header)?;
            let conn = u32::from_be_bytes(header[..4].try_into().expect("4 bytes"));
            let len = u32::from_be_bytes(header[4..].try_into().expect("4 bytes")) as usize;
            let mut payload = vec![0u8; len];
            self.stream.read_exact(&mut payload)?;
            self.pending.entry(conn).or_default().extend_from_slice(&payload);
        }
    }

    /// The next complete ttrpc message of any connection.
    fn next_message(&mut self) -> Option<WireMessage> {
        for (conn, buf) in self.pending.iter_mut() {
            if buf.len() < 10 {
                continue;
            }
            let len = u32::from_be_bytes(buf[..4].try_into().expect("4 bytes")) as usize;
            if buf.len() < 10 + len {
                continue;
            }
            let stream_id = u32::from_be_bytes(buf[4..8].try_into().expect("4 bytes"));
            let kind = buf[8];
            let payload = buf[10..10 + len].to_vec();
            buf.drain(..10 + len);
            return Some(WireMessage {
                conn: *conn,
                kind,
                stream_id,
                payload,
            });
        }
        None
    }

    fn answer(&self, req: &ttrpc::Request) -> std::io::Result<Vec<u8>> {
        use protobuf::Message as _;
        let bytes = match (req.service.as_str(), req.method.as_str()) {
            (PLUGIN_SERVICE, "Configure") => api::ConfigureResponse {
                events: self.events.bits(),
                ..Default::default()
            }
            .write_to_bytes(),
            (PLUGIN_SERVICE, "Synchronize") => {
                let s = api::SynchronizeRequest::parse_from_bytes(&req.payload).map_err(std::io::Error::other)?;
                api::SynchronizeResponse {
                    more: s.more,
                    ..Default::default()
                }
                .write_to_bytes()
            }
            // Every other request has a reply whose fields are all optional.
            _ => Ok(Vec::new()),
        };
        bytes.map_err(std::io::Error::other)
    }
}
