//! Writes the seed corpora (`fuzz/corpus/<target>/seed-*`) from the
//! repository's fixtures: the busybox spec, the scenarios' pods and
//! containers, the adjuster's example rules, the operator guide's shim config.
//! Messages are encoded by the real encoders (protobuf, ttrpc header, mux
//! frame layout). Run from the repository root:
//! `cargo run --manifest-path fuzz/Cargo.toml --example seeds`.

use std::{fs, path::Path};

use nri_adaptation::{api, convert};
use nri_fuzz::{busybox_spec, join_parts};
use nri_proto::mux::{MAX_PAYLOAD, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use protobuf::{Message, MessageField};

/// Writes one seed, unless the file already holds the same bytes in
/// another order: rust-protobuf encodes map fields in `HashMap` order,
/// which changes from run to run, so the same messages come out with
/// their map entries permuted. Keeping the old file then keeps the
/// generator's reruns from changing the checked-in corpus.
fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new("fuzz/corpus").join(target);
    fs::create_dir_all(&dir).expect("corpus dir");
    let path = dir.join(format!("seed-{name}"));
    if let Ok(old) = fs::read(&path) {
        let sorted = |b: &[u8]| {
            let mut v = b.to_vec();
            v.sort_unstable();
            v
        };
        if old.len() == bytes.len() && sorted(&old) == sorted(bytes) {
            return;
        }
    }
    fs::write(path, bytes).expect("write seed");
}

fn pod() -> api::PodSandbox {
    api::PodSandbox {
        id: "p1".into(),
        name: "web".into(),
        namespace: "default".into(),
        uid: "0f0e-1234".into(),
        annotations: [("team".to_string(), "blue".to_string())].into(),
        ..Default::default()
    }
}

fn container() -> api::Container {
    convert::container_from_spec("c1", "p1", "app", &busybox_spec())
}

fn adjuster_config() -> String {
    fs::read_to_string("testdata/plugins/adjuster.toml").expect("testdata/plugins/adjuster.toml")
}

/// The adjuster's answer for container c1 (env, annotation, mount, memory).
fn adjuster_response() -> api::CreateContainerResponse {
    let cfg = nri_adjuster::Config::parse(&adjuster_config()).expect("example rules parse");
    nri_adjuster::response_for(&cfg, &pod(), &container())
}

fn cpu_shares(shares: u64) -> api::LinuxResources {
    let mut r = api::LinuxResources::new();
    r.cpu.mut_or_insert_default().shares = MessageField::some(api::OptionalUInt64 {
        value: shares,
        ..Default::default()
    });
    r
}

fn update_of(id: &str, shares: u64) -> api::ContainerUpdate {
    let mut u = api::ContainerUpdate::new();
    u.container_id = id.into();
    u.linux.mut_or_insert_default().resources = MessageField::some(cpu_shares(shares));
    u
}

/// One ttrpc message (10-byte header, then the payload) as ttrpc-rust
/// writes it.
fn ttrpc_message(stream: u32, type_: u8, payload: &[u8]) -> Vec<u8> {
    let mut h = ttrpc::MessageHeader::new_request(stream, payload.len() as u32);
    h.type_ = type_;
    let mut out: Vec<u8> = h.into();
    out.extend_from_slice(payload);
    out
}

fn frame(id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = id.to_be_bytes().to_vec();
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn request(service: &str, method: &str, payload: &impl Message) -> Vec<u8> {
    let req = ttrpc::Request {
        service: service.into(),
        method: method.into(),
        payload: payload.write_to_bytes().unwrap(),
        timeout_nano: 2_000_000_000,
        ..Default::default()
    };
    req.write_to_bytes().unwrap()
}

fn response(payload: &impl Message) -> Vec<u8> {
    let rsp = ttrpc::Response {
        payload: payload.write_to_bytes().unwrap(),
        ..Default::default()
    };
    rsp.write_to_bytes().unwrap()
}

const RUNTIME: &str = "nri.pkg.api.v1alpha1.Runtime";
const REQUEST: u8 = 1;
const RESPONSE: u8 = 2;

fn mux_seeds() {
    let register = api::RegisterPluginRequest {
        plugin_name: "logger".into(),
        plugin_idx: "10".into(),
        NRI_version: nri_proto::NRI_VERSION.into(),
        ..Default::default()
    };
    let reg = ttrpc_message(1, REQUEST, &request(RUNTIME, "RegisterPlugin", &register));
    write("mux_frames", "register", &frame(RUNTIME_SERVICE_CONN, &reg));

    let configure = api::ConfigureResponse {
        events: 0x8,
        ..Default::default()
    };
    let cfg = ttrpc_message(1, RESPONSE, &response(&configure));
    let mut both = frame(RUNTIME_SERVICE_CONN, &reg);
    both.extend(frame(PLUGIN_SERVICE_CONN, &cfg));
    write("mux_frames", "register-configure", &both);

    // A message over 4096 bytes: ttrpc-rust writes it as two writes, the
    // mux as two frames.
    let big = ttrpc_message(3, RESPONSE, &response(&adjuster_response_padded()));
    let (head, tail) = big.split_at(4096);
    let mut split = frame(PLUGIN_SERVICE_CONN, head);
    split.extend(frame(PLUGIN_SERVICE_CONN, tail));
    write("mux_frames", "split-message", &split);

    // Unopened id, empty frame, then a frame for conn 1.
    let mut mixed = frame(7, b"nobody listens");
    mixed.extend(frame(PLUGIN_SERVICE_CONN, b""));
    mixed.extend(frame(PLUGIN_SERVICE_CONN, &cfg));
    write("mux_frames", "unopened-and-empty", &mixed);

    let mut oversized = frame(RUNTIME_SERVICE_CONN, &reg);
    oversized.extend(PLUGIN_SERVICE_CONN.to_be_bytes());
    oversized.extend(((MAX_PAYLOAD + 1) as u32).to_be_bytes());
    write("mux_frames", "oversized", &oversized);

    let mut truncated = frame(RUNTIME_SERVICE_CONN, &reg);
    truncated.truncate(truncated.len() - 3);
    write("mux_frames", "truncated", &truncated);
}

/// The adjuster's response with enough environment to pass 4096 bytes.
fn adjuster_response_padded() -> api::CreateContainerResponse {
    let mut rsp = adjuster_response();
    let adj = rsp.adjust.mut_or_insert_default();
    for i in 0..200 {
        adj.env.push(api::KeyValue {
            key: format!("PAD_{i}"),
            value: "x".repeat(16),
            ..Default::default()
        });
    }
    rsp
}

fn message_seeds() {
    let kinds = nri_fuzz::nri_messages::KINDS;
    let put = |kind: &str, m: &dyn protobuf::MessageDyn| {
        let idx = kinds.iter().position(|k| *k == kind).expect("known kind") as u8;
        let mut bytes = vec![idx];
        bytes.extend(m.write_to_bytes_dyn().unwrap());
        write("nri_messages", kind, &bytes);
    };
    let pod = pod();
    let ctr = container();
    let rsp = adjuster_response();
    put(
        "RegisterPluginRequest",
        &api::RegisterPluginRequest {
            plugin_name: "logger".into(),
            plugin_idx: "10".into(),
            NRI_version: nri_proto::NRI_VERSION.into(),
            ..Default::default()
        },
    );
    put(
        "UpdateContainersRequest",
        &api::UpdateContainersRequest {
            update: vec![update_of("c1", 512)],
            evict: vec![api::ContainerEviction {
                container_id: "c2".into(),
                reason: "fuzz".into(),
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    put(
        "ConfigureResponse",
        &api::ConfigureResponse {
            events: 0x7ffff,
            ..Default::default()
        },
    );
    put(
        "SynchronizeResponse",
        &api::SynchronizeResponse {
            update: vec![update_of("c1", 256)],
            more: true,
            ..Default::default()
        },
    );
    put("CreateContainerResponse", &rsp);
    put(
        "UpdateContainerResponse",
        &api::UpdateContainerResponse {
            update: vec![update_of("c2", 128)],
            ..Default::default()
        },
    );
    put(
        "StopContainerResponse",
        &api::StopContainerResponse {
            update: vec![update_of("c2", 1024)],
            ..Default::default()
        },
    );
    put("UpdatePodSandboxResponse", &api::UpdatePodSandboxResponse::new());
    put(
        "ValidateContainerAdjustmentResponse",
        &api::ValidateContainerAdjustmentResponse {
            reject: true,
            reason: "fuzz".into(),
            ..Default::default()
        },
    );
    put("Empty", &api::Empty::new());
    let req = api::CreateContainerRequest {
        pod: MessageField::some(pod.clone()),
        container: MessageField::some(ctr.clone()),
        ..Default::default()
    };
    put(
        "ttrpc.Request",
        &ttrpc::Request::parse_from_bytes(&request("nri.pkg.api.v1alpha1.Plugin", "CreateContainer", &req)).unwrap(),
    );
    put(
        "ttrpc.Response",
        &ttrpc::Response::parse_from_bytes(&response(&rsp)).unwrap(),
    );
    put(
        "ConfigureRequest",
        &api::ConfigureRequest {
            config: adjuster_config(),
            runtime_name: "nri-shim".into(),
            runtime_version: "0.1.0".into(),
            registration_timeout: 5000,
            request_timeout: 2000,
            ..Default::default()
        },
    );
    put(
        "SynchronizeRequest",
        &api::SynchronizeRequest {
            pods: vec![pod.clone()],
            containers: vec![ctr.clone()],
            more: false,
            ..Default::default()
        },
    );
    put("CreateContainerRequest", &req);
    let (p, c) = (pod.clone(), ctr.clone());
    put(
        "UpdateContainerRequest",
        &api::UpdateContainerRequest {
            pod: MessageField::some(p.clone()),
            container: MessageField::some(c.clone()),
            linux_resources: MessageField::some(cpu_shares(512)),
            ..Default::default()
        },
    );
    put(
        "StopContainerRequest",
        &api::StopContainerRequest {
            pod: MessageField::some(p.clone()),
            container: MessageField::some(c.clone()),
            ..Default::default()
        },
    );
    put(
        "UpdatePodSandboxRequest",
        &api::UpdatePodSandboxRequest {
            pod: MessageField::some(p.clone()),
            overhead_linux_resources: MessageField::some(cpu_shares(2)),
            linux_resources: MessageField::some(cpu_shares(1024)),
            ..Default::default()
        },
    );
    put(
        "StateChangeEvent",
        &api::StateChangeEvent {
            event: api::Event::START_CONTAINER.into(),
            pod: MessageField::some(p.clone()),
            container: MessageField::some(c.clone()),
            ..Default::default()
        },
    );
    macro_rules! pod_req {
        ($ty:ident) => {
            put(
                stringify!($ty),
                &api::$ty {
                    pod: MessageField::some(p.clone()),
                    ..Default::default()
                },
            )
        };
    }
    macro_rules! ctr_req {
        ($ty:ident) => {
            put(
                stringify!($ty),
                &api::$ty {
                    pod: MessageField::some(p.clone()),
                    container: MessageField::some(c.clone()),
                    ..Default::default()
                },
            )
        };
    }
    pod_req!(RunPodSandboxRequest);
    pod_req!(PostUpdatePodSandboxRequest);
    pod_req!(StopPodSandboxRequest);
    pod_req!(RemovePodSandboxRequest);
    ctr_req!(PostCreateContainerRequest);
    ctr_req!(StartContainerRequest);
    ctr_req!(PostStartContainerRequest);
    ctr_req!(PostUpdateContainerRequest);
    ctr_req!(RemoveContainerRequest);
    put(
        "ValidateContainerAdjustmentRequest",
        &api::ValidateContainerAdjustmentRequest {
            pod: MessageField::some(p.clone()),
            container: MessageField::some(c.clone()),
            adjust: rsp.adjust.clone(),
            plugins: vec![api::PluginInstance {
                name: "adjuster".into(),
                index: "10".into(),
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    put(
        "UpdateContainersResponse",
        &api::UpdateContainersResponse {
            failed: vec![update_of("c1", 2)],
            ..Default::default()
        },
    );
}

fn merge_seeds() {
    let req = api::CreateContainerRequest {
        pod: MessageField::some(pod()),
        container: MessageField::some(container()),
        ..Default::default()
    };
    let req = req.write_to_bytes().unwrap();
    let rsp = adjuster_response().write_to_bytes().unwrap();
    let mut other = adjuster_response();
    other.update.push(update_of("c2", 512));
    let other = other.write_to_bytes().unwrap();
    let mut seed = vec![0u8];
    seed.extend(join_parts(&[&req, &rsp]));
    write("merge", "create-one", &seed);
    // The same env from two plugins: a conflict.
    // Mode: create (0), restricted permissions (4), every validator check (8).
    let mut seed = vec![4u8 | 8];
    seed.extend(join_parts(&[&req, &rsp, &other]));
    write("merge", "create-conflict", &seed);

    let ureq = api::UpdateContainerRequest {
        pod: MessageField::some(pod()),
        container: MessageField::some(container()),
        linux_resources: MessageField::some(cpu_shares(512)),
        ..Default::default()
    }
    .write_to_bytes()
    .unwrap();
    let ursp = api::UpdateContainerResponse {
        update: vec![update_of("c1", 256), update_of("c2", 128)],
        ..Default::default()
    }
    .write_to_bytes()
    .unwrap();
    let mut seed = vec![1u8];
    seed.extend(join_parts(&[&ureq, &ursp, &ursp]));
    write("merge", "update", &seed);
    let srsp = api::StopContainerResponse {
        update: vec![update_of("c2", 1024)],
        ..Default::default()
    }
    .write_to_bytes()
    .unwrap();
    let mut seed = vec![2u8];
    seed.extend(join_parts(&[b"", &srsp]));
    write("merge", "stop", &seed);
}

fn adjust_seeds() {
    let spec = fs::read("testdata/oci/busybox.json").unwrap();
    let adj = adjuster_response().adjust.unwrap_or_default().write_to_bytes().unwrap();
    let res = cpu_shares(512).write_to_bytes().unwrap();
    write("adjust", "busybox-adjuster", &join_parts(&[&spec, &adj, &res]));
    let mut full = api::ContainerAdjustment::new();
    full.args = vec!["sleep".into(), "1".into()];
    full.rlimits.push(api::POSIXRlimit {
        type_: "nofile".into(),
        hard: 1024,
        soft: 512,
        ..Default::default()
    });
    let linux = full.linux.mut_or_insert_default();
    linux.oom_score_adj = MessageField::some(api::OptionalInt {
        value: 500,
        ..Default::default()
    });
    linux.resources = MessageField::some(cpu_shares(2));
    linux.cgroups_path = "/fuzz".into();
    linux.sysctl.insert("net.ipv4.ip_forward".into(), "1".into());
    full.CDI_devices.push(api::CDIDevice {
        name: "vendor.com/dev=one".into(),
        ..Default::default()
    });
    let full = full.write_to_bytes().unwrap();
    write(
        "adjust",
        "default-spec-many-fields",
        &join_parts(&[b"\x01", &full, &res]),
    );
}

fn config_seeds() {
    let guide = fs::read_to_string("docs/operator-guide.md").unwrap();
    let mut n = 0;
    let mut rest = guide.as_str();
    while let Some(start) = rest.find("```toml\n") {
        let body = &rest[start + 8..];
        let end = body.find("```").expect("closed block");
        let block = &body[..end];
        if block.contains("[nri") || block.contains("[shim]") {
            n += 1;
            write("shim_config", &format!("guide-{n}"), block.as_bytes());
        }
        rest = &body[end..];
    }
    assert!(n > 0, "README has shim config examples");
    write("adjuster_config", "testdata", adjuster_config().as_bytes());
    write(
        "adjuster_config",
        "every-key",
        br#"[[rule]]
name = "all"
[rule.match]
pod_name = "web*"
pod_namespace = "default"
container_name = "?pp"
annotations = { team = "blue" }
[rule.adjust]
env = { A = "1", B = "-" }
annotations = { x = "y", gone = "-" }
mounts = [{ destination = "/data", source = "/srv", type = "bind", options = ["rbind", "ro"] }]
devices = [{ path = "/dev/fuse", type = "c", major = 10, minor = 229, file_mode = 438, uid = 0, gid = 0 }]
cpu = { shares = 512, quota = 50000, period = 100000, cpus = "0-1", mems = "0" }
memory = { limit = "256Mi", reservation = "128Mi", swap = -1, swappiness = 10, disable_oom_killer = false }
pids = { limit = 100 }
rlimits = [{ type = "RLIMIT_NOFILE", hard = 4096, soft = 1024 }]
oom_score_adj = 100
"#,
    );
}

fn main() {
    mux_seeds();
    message_seeds();
    merge_seeds();
    adjust_seeds();
    config_seeds();
}
