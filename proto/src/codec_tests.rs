//! Every message of the protocol survives encode → decode with every field
//! set, and selected field numbers are pinned to their wire bytes.

use protobuf::{
    Message, MessageDyn,
    reflect::{MessageDescriptor, ReflectValueBox, RuntimeFieldType, RuntimeType},
};

use crate::api;

fn sample(rt: &RuntimeType, depth: usize, salt: u32) -> Option<ReflectValueBox> {
    Some(match rt {
        RuntimeType::I32 => ReflectValueBox::I32(-7 - salt as i32),
        RuntimeType::I64 => ReflectValueBox::I64(-(1 << 40) - salt as i64),
        RuntimeType::U32 => ReflectValueBox::U32(4_000_000_000 - salt),
        RuntimeType::U64 => ReflectValueBox::U64((1 << 50) + salt as u64),
        RuntimeType::F32 => ReflectValueBox::F32(1.5),
        RuntimeType::F64 => ReflectValueBox::F64(2.5),
        RuntimeType::Bool => ReflectValueBox::Bool(true),
        RuntimeType::String => ReflectValueBox::String(format!("value-{salt}")),
        RuntimeType::VecU8 => ReflectValueBox::Bytes(vec![1, 2, salt as u8]),
        RuntimeType::Enum(e) => {
            let values: Vec<_> = e.values().collect();
            let v = &values[(1 + salt as usize) % values.len()];
            ReflectValueBox::Enum(e.clone(), v.value())
        }
        RuntimeType::Message(m) => {
            if depth == 0 {
                return None;
            }
            ReflectValueBox::Message(filled(m, depth - 1))
        }
    })
}

/// A message of type `md` with every field set to a non-default value,
/// nested messages filled down to `depth` levels.
fn filled(md: &MessageDescriptor, depth: usize) -> Box<dyn MessageDyn> {
    let mut msg = md.new_instance();
    for (i, field) in md.fields().enumerate() {
        let salt = i as u32 + 1;
        match field.runtime_field_type() {
            RuntimeFieldType::Singular(rt) => {
                if let Some(v) = sample(&rt, depth, salt) {
                    field.set_singular_field(&mut *msg, v);
                }
            }
            RuntimeFieldType::Repeated(rt) => {
                for k in 0..2 {
                    if let Some(v) = sample(&rt, depth, salt + k) {
                        field.mut_repeated(&mut *msg).push(v);
                    }
                }
            }
            RuntimeFieldType::Map(kt, vt) => {
                for k in 0..2 {
                    if let (Some(key), Some(v)) = (sample(&kt, 0, salt + k), sample(&vt, depth, salt + k)) {
                        field.mut_map(&mut *msg).insert(key, v);
                    }
                }
            }
        }
    }
    msg
}

fn all_messages() -> Vec<MessageDescriptor> {
    let fd = api::file_descriptor();
    let mut out = Vec::new();
    let mut stack: Vec<MessageDescriptor> = fd.messages().collect();
    while let Some(md) = stack.pop() {
        stack.extend(md.nested_messages().filter(|m| !m.is_map_entry()));
        out.push(md);
    }
    out
}

#[test]
fn every_message_roundtrips_with_all_fields_set() {
    let messages = all_messages();
    assert!(messages.len() >= 85, "only {} messages in the schema", messages.len());
    for md in messages {
        let msg = filled(&md, 3);
        let bytes = msg.write_to_bytes_dyn().unwrap();
        if md.fields().next().is_some() {
            assert!(!bytes.is_empty(), "{} encoded to nothing", md.full_name());
        }
        let back = md.parse_from_bytes(&bytes).unwrap();
        assert!(md.eq(&*msg, &*back), "{} changed in a roundtrip", md.full_name());
    }
}

#[test]
fn every_rpc_request_and_response_is_a_message() {
    let fd = api::file_descriptor();
    let mut seen = Vec::new();
    for svc in fd.services() {
        for m in svc.methods() {
            let input = m.input_type();
            let output = m.output_type();
            for md in [input, output] {
                let msg = filled(&md, 4);
                let back = md.parse_from_bytes(&msg.write_to_bytes_dyn().unwrap()).unwrap();
                assert!(md.eq(&*msg, &*back), "{}", md.full_name());
            }
            seen.push(format!("{}/{}", svc.proto().name(), m.proto().name()));
        }
    }
    let expected = [
        "Runtime/RegisterPlugin",
        "Runtime/UpdateContainers",
        "Plugin/Configure",
        "Plugin/Synchronize",
        "Plugin/Shutdown",
        "Plugin/RunPodSandbox",
        "Plugin/UpdatePodSandbox",
        "Plugin/PostUpdatePodSandbox",
        "Plugin/StopPodSandbox",
        "Plugin/RemovePodSandbox",
        "Plugin/CreateContainer",
        "Plugin/PostCreateContainer",
        "Plugin/StartContainer",
        "Plugin/PostStartContainer",
        "Plugin/UpdateContainer",
        "Plugin/PostUpdateContainer",
        "Plugin/StopContainer",
        "Plugin/RemoveContainer",
        "Plugin/StateChange",
        "Plugin/ValidateContainerAdjustment",
        "HostFunctions/Log",
    ];
    assert_eq!(seen, expected);
    assert_eq!(fd.proto().package(), "nri.pkg.api.v1alpha1");
}

#[test]
fn field_numbers_on_the_wire() {
    // tag = (field_number << 3) | wire_type
    let rsp = api::ConfigureResponse {
        events: 8,
        ..Default::default()
    };
    assert_eq!(rsp.write_to_bytes().unwrap(), [2 << 3, 8]);

    let req = api::ConfigureRequest {
        request_timeout: 2000,
        NRI_version: "v".into(),
        ..Default::default()
    };
    assert_eq!(
        req.write_to_bytes().unwrap(),
        [5 << 3, 0xd0, 0x0f, (6 << 3) | 2, 1, b'v']
    );

    let sync = api::SynchronizeRequest {
        more: true,
        ..Default::default()
    };
    assert_eq!(sync.write_to_bytes().unwrap(), [3 << 3, 1]);

    let mut adj = api::ContainerAdjustment::new();
    adj.args.push("x".into());
    assert_eq!(adj.write_to_bytes().unwrap(), [(9 << 3) | 2, 1, b'x']);

    let mut c = api::Container::new();
    c.image.mut_or_insert_default().name = "i".into();
    // field 22 needs a two-byte varint tag: 178 = (22 << 3) | 2, then 1
    assert_eq!(c.write_to_bytes().unwrap(), [178, 1, 3, (1 << 3) | 2, 1, b'i']);

    let mut mem = api::LinuxMemory::new();
    mem.use_hierarchy.mut_or_insert_default().value = true;
    assert_eq!(mem.write_to_bytes().unwrap(), [(8 << 3) | 2, 2, 1 << 3, 1]);

    let mut res = api::LinuxResources::new();
    res.pids.mut_or_insert_default().limit = 5;
    assert_eq!(res.write_to_bytes().unwrap(), [(8 << 3) | 2, 2, 1 << 3, 5]);

    let mut lca = api::LinuxContainerAdjustment::new();
    lca.memory_policy.mut_or_insert_default().nodes = "0".into();
    assert_eq!(lca.write_to_bytes().unwrap(), [(12 << 3) | 2, 3, (2 << 3) | 2, 1, b'0']);

    let ev = api::ContainerEviction {
        reason: "r".into(),
        ..Default::default()
    };
    assert_eq!(ev.write_to_bytes().unwrap(), [(2 << 3) | 2, 1, b'r']);
}

#[test]
fn enum_values() {
    assert_eq!(api::Event::VALIDATE_CONTAINER_ADJUSTMENT as i32, 14);
    assert_eq!(api::Event::LAST as i32, 15);
    assert_eq!(api::Field::MemoryPolicy as i32, 40);
    assert_eq!(api::Field::Namespace as i32, 33);
    assert_eq!(api::MpolMode::MPOL_WEIGHTED_INTERLEAVE as i32, 6);
    assert_eq!(api::LinuxSchedulerFlag::SCHED_FLAG_UTIL_CLAMP_MAX as i32, 6);
    assert_eq!(api::security_profile::ProfileType::LOCALHOST as i32, 2);
    assert_eq!(api::ContainerState::CONTAINER_STOPPED as i32, 4);
    assert_eq!(api::IOPrioClass::IOPRIO_CLASS_IDLE as i32, 3);
}
