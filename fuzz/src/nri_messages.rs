//! Decoding of every protobuf message one side of NRI receives from the
//! other. The first input byte picks the message type ([`KINDS`]), the rest
//! is its encoding.
//!
//! Properties: a message that decodes encodes again to bytes of its
//! computed size, which decode to an equal message; what the runtime does
//! with it next (name checks of RegisterPlugin, the event mask of
//! Configure, permission checks of updates and adjustments) returns
//! instead of panicking; a successful decode allocates at most a bounded
//! multiple of the input, and a failed one at most rust-protobuf's fixed
//! cap on top: it reserves room for a length-delimited field as the length
//! says (bytes: up to 10 MB; packed `uint32`/enum fields such as
//! `additional_gids` or scheduler flags: up to 10 M elements, 40 MB) before
//! it finds the input shorter, so a 6-byte message can cost 40 MB until the
//! decode fails (transient, bounded; one decode at a time per thread).

use nri_adaptation::{FieldGroup, Permissions};
use nri_proto::{api, events::EventMask, naming};
use protobuf::Message;

use crate::alloc::Mark;

/// The message types, by the index the first input byte selects (modulo
/// their number).
pub const KINDS: &[&str] = &[
    // What the runtime receives from a plugin: Runtime requests...
    "RegisterPluginRequest",
    "UpdateContainersRequest",
    // ... and Plugin responses.
    "ConfigureResponse",
    "SynchronizeResponse",
    "CreateContainerResponse",
    "UpdateContainerResponse",
    "StopContainerResponse",
    "UpdatePodSandboxResponse",
    "ValidateContainerAdjustmentResponse",
    "Empty",
    // The ttrpc envelopes around them.
    "ttrpc.Request",
    "ttrpc.Response",
    // What a plugin (nri-stub) receives from the runtime.
    "ConfigureRequest",
    "SynchronizeRequest",
    "CreateContainerRequest",
    "UpdateContainerRequest",
    "StopContainerRequest",
    "UpdatePodSandboxRequest",
    "StateChangeEvent",
    "RunPodSandboxRequest",
    "PostUpdatePodSandboxRequest",
    "StopPodSandboxRequest",
    "RemovePodSandboxRequest",
    "PostCreateContainerRequest",
    "StartContainerRequest",
    "PostStartContainerRequest",
    "PostUpdateContainerRequest",
    "RemoveContainerRequest",
    "ValidateContainerAdjustmentRequest",
    "UpdateContainersResponse",
];

/// Bytes one decoded input byte may cost (a repeated empty submessage is
/// two bytes on the wire and a whole struct in memory).
const PER_BYTE: usize = 2048;
const SLACK: usize = 64 << 10;
/// rust-protobuf's `READ_RAW_BYTES_MAX_ALLOC` (10 M) elements of 4 bytes:
/// the most a failing decode reserves on a length it has not checked.
const PROTOBUF_RESERVE_CAP: usize = 10_000_000 * 4;

/// Decodes, re-encodes and re-decodes `bytes` as `M`.
fn decode<M: Message + PartialEq + std::fmt::Debug>(bytes: &[u8]) -> Option<M> {
    let mark = Mark::now();
    let parsed = M::parse_from_bytes(bytes);
    let usage = mark.usage();
    let bound = PER_BYTE * bytes.len() + SLACK + if parsed.is_ok() { 0 } else { PROTOBUF_RESERVE_CAP };
    assert!(
        usage.peak <= bound,
        "decoding {} bytes as {} (ok: {}) allocated {} bytes at the peak",
        bytes.len(),
        M::NAME,
        parsed.is_ok(),
        usage.peak
    );
    let m = parsed.ok()?;
    let encoded = m.write_to_bytes().expect("a decoded message encodes");
    assert_eq!(encoded.len() as u64, m.compute_size(), "computed size");
    let again = M::parse_from_bytes(&encoded).expect("an encoded message decodes");
    assert!(again == m, "re-decoded message differs");
    let _ = format!("{m:?}");
    Some(m)
}

/// Permissions a restricted plugin might have: only resources.
fn restricted() -> Permissions {
    Permissions::allowing([FieldGroup::Cpu, FieldGroup::Memory])
}

/// Runs one input; panics when a property fails.
pub fn run(data: &[u8]) {
    let Some((&kind, bytes)) = data.split_first() else {
        return;
    };
    let perms = [Permissions::all(), restricted()];
    match usize::from(kind) % KINDS.len() {
        0 => {
            if let Some(m) = decode::<api::RegisterPluginRequest>(bytes) {
                let _ = naming::check_index(&m.plugin_idx).and_then(|()| naming::check_name(&m.plugin_name));
            }
        }
        1 => {
            if let Some(m) = decode::<api::UpdateContainersRequest>(bytes) {
                for p in &perms {
                    let _ = p.check_updates("10-fuzz", &m.update);
                    let _ = p.check_evictions("10-fuzz", &m.evict);
                }
            }
        }
        2 => {
            if let Some(m) = decode::<api::ConfigureResponse>(bytes)
                && let Ok(mask) = EventMask::from_configure(m.events)
            {
                let _ = mask.events().count();
                let _ = mask.to_string();
            }
        }
        3 => {
            if let Some(m) = decode::<api::SynchronizeResponse>(bytes) {
                for p in &perms {
                    let _ = p.check_updates("10-fuzz", &m.update);
                }
            }
        }
        4 => {
            if let Some(m) = decode::<api::CreateContainerResponse>(bytes) {
                for p in &perms {
                    let _ = p.check_create("10-fuzz", &m);
                    let _ = p.check_evictions("10-fuzz", &m.evict);
                }
            }
        }
        5 => {
            if let Some(m) = decode::<api::UpdateContainerResponse>(bytes) {
                for p in &perms {
                    let _ = p.check_updates("10-fuzz", &m.update);
                    let _ = p.check_evictions("10-fuzz", &m.evict);
                }
            }
        }
        6 => {
            if let Some(m) = decode::<api::StopContainerResponse>(bytes) {
                for p in &perms {
                    let _ = p.check_updates("10-fuzz", &m.update);
                }
            }
        }
        7 => drop(decode::<api::UpdatePodSandboxResponse>(bytes)),
        8 => drop(decode::<api::ValidateContainerAdjustmentResponse>(bytes)),
        9 => drop(decode::<api::Empty>(bytes)),
        10 => drop(decode::<ttrpc::Request>(bytes)),
        11 => drop(decode::<ttrpc::Response>(bytes)),
        12 => drop(decode::<api::ConfigureRequest>(bytes)),
        13 => drop(decode::<api::SynchronizeRequest>(bytes)),
        14 => drop(decode::<api::CreateContainerRequest>(bytes)),
        15 => drop(decode::<api::UpdateContainerRequest>(bytes)),
        16 => drop(decode::<api::StopContainerRequest>(bytes)),
        17 => drop(decode::<api::UpdatePodSandboxRequest>(bytes)),
        18 => drop(decode::<api::StateChangeEvent>(bytes)),
        19 => drop(decode::<api::RunPodSandboxRequest>(bytes)),
        20 => drop(decode::<api::PostUpdatePodSandboxRequest>(bytes)),
        21 => drop(decode::<api::StopPodSandboxRequest>(bytes)),
        22 => drop(decode::<api::RemovePodSandboxRequest>(bytes)),
        23 => drop(decode::<api::PostCreateContainerRequest>(bytes)),
        24 => drop(decode::<api::StartContainerRequest>(bytes)),
        25 => drop(decode::<api::PostStartContainerRequest>(bytes)),
        26 => drop(decode::<api::PostUpdateContainerRequest>(bytes)),
        27 => drop(decode::<api::RemoveContainerRequest>(bytes)),
        28 => drop(decode::<api::ValidateContainerAdjustmentRequest>(bytes)),
        29 => drop(decode::<api::UpdateContainersResponse>(bytes)),
        _ => unreachable!("one arm per kind"),
    }
}
