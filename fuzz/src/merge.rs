//! The merge of plugin responses ([`CreateResult`], [`UpdateResult`]) as
//! the adaptation runs it: permission check of each response, merge in
//! plugin order, the default validator over the merged result, and `adjust`
//! of the busybox spec with the merged adjustment.
//!
//! Input: a mode byte, then [`parts`](crate::parts): the runtime's request
//! (CreateContainerRequest, UpdateContainerRequest, or nothing for
//! StopContainer), then one encoded response per plugin (plugins `00-p0`,
//! `01-p1`, ...). Mode: bits 0–1 the request (create, update, stop), bit 2
//! restricted permissions (resources only) for odd plugins, bit 3 every
//! default validator check on.
//!
//! Properties: no panic; a merged create response and merged updates
//! encode and decode to themselves; the UpdateContainer target's entry is
//! the last one; the owners handed to validators name only plugins that
//! answered.

use nri_adaptation::{
    CreateResult, DefaultValidator, DefaultValidatorConfig, FieldGroup, Permissions, UpdateResult, adjust, api,
};
use protobuf::{Message, MessageField};

fn plugin_name(i: usize) -> String {
    format!("{:02}-p{i}", i % 100)
}

fn permissions(mode: u8, i: usize) -> Permissions {
    if mode & 4 != 0 && i % 2 == 1 {
        Permissions::allowing([FieldGroup::Cpu, FieldGroup::Memory])
    } else {
        Permissions::all()
    }
}

fn validator(mode: u8) -> DefaultValidator {
    let on = mode & 8 != 0;
    DefaultValidator::new(DefaultValidatorConfig {
        enable: true,
        reject_oci_hook_adjustment: on,
        reject_runtime_default_seccomp_adjustment: on,
        reject_unconfined_seccomp_adjustment: on,
        reject_custom_seccomp_adjustment: on,
        reject_namespace_adjustment: on,
        reject_sysctl_adjustment: on,
        required_plugins: if on {
            vec!["p0".into(), "01-p1".into()]
        } else {
            Vec::new()
        },
        tolerate_missing_plugins_annotation: "tolerate".into(),
    })
}

fn round_trips<M: Message + PartialEq>(m: &M) {
    let bytes = m.write_to_bytes().expect("a merged message encodes");
    assert!(
        M::parse_from_bytes(&bytes).expect("decodes") == *m,
        "merged message changed by encoding"
    );
}

/// Runs one input; panics when a property fails.
pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let parts = crate::parts(rest);
    let Some((request, responses)) = parts.split_first() else {
        return;
    };
    match mode & 3 {
        0 | 3 => create(mode, request, responses),
        1 => update(mode, Some(request), responses),
        _ => update(mode, None, responses),
    }
}

fn create(mode: u8, request: &[u8], responses: &[&[u8]]) {
    let Ok(req) = api::CreateContainerRequest::parse_from_bytes(request) else {
        return;
    };
    let mut result = CreateResult::new(req);
    let mut present = Vec::new();
    for (i, bytes) in responses.iter().enumerate() {
        let Ok(mut rsp) = api::CreateContainerResponse::parse_from_bytes(bytes) else {
            continue;
        };
        let name = plugin_name(i);
        if permissions(mode, i).check_create(&name, &rsp).is_err() {
            // The adaptation refuses the answer (and fails the request
            // for a plugin whose policy is to fail).
            continue;
        }
        rsp.evict.clear();
        if result.apply(&name, rsp).is_err() {
            return;
        }
        present.push(api::PluginInstance {
            name: format!("p{i}"),
            index: format!("{:02}", i % 100),
            ..Default::default()
        });
    }
    let pod = result.request().pod.get_or_default().clone();
    let (rsp, pristine, owners) = result.into_parts();
    round_trips(&rsp);
    let owners = owners.into_proto();
    // Records are `IDX-NAME`, `-IDX-NAME` (cleared) or, for OCI hooks, a
    // comma-separated list.
    let answered = |owner: &str| present.iter().any(|p| format!("{}-{}", p.index, p.name) == owner);
    for by_field in owners.owners.values() {
        let compound = by_field.compound.values().flat_map(|c| c.owners.values());
        for record in by_field.simple.values().chain(compound) {
            for owner in record.trim_start_matches('-').split(',') {
                assert!(answered(owner), "owner {owner:?} never answered");
            }
        }
    }
    let req = api::ValidateContainerAdjustmentRequest {
        pod: MessageField::some(pod),
        container: MessageField::some(pristine),
        adjust: rsp.adjust.clone(),
        update: rsp.update.clone(),
        owners: MessageField::some(owners),
        plugins: present,
        ..Default::default()
    };
    let _ = validator(mode).validate(&req);
    let mut spec = crate::busybox_spec();
    let _ = adjust(&mut spec, rsp.adjust.get_or_default());
}

fn update(mode: u8, request: Option<&[u8]>, responses: &[&[u8]]) {
    let mut result = match request {
        Some(bytes) => match api::UpdateContainerRequest::parse_from_bytes(bytes) {
            Ok(req) => UpdateResult::for_update(req),
            Err(_) => return,
        },
        None => UpdateResult::for_stop(),
    };
    let target = request.map(|_| result.update_request().container.id.clone());
    for (i, bytes) in responses.iter().enumerate() {
        let update = if target.is_some() {
            api::UpdateContainerResponse::parse_from_bytes(bytes).map(|r| r.update)
        } else {
            api::StopContainerResponse::parse_from_bytes(bytes).map(|r| r.update)
        };
        let Ok(update) = update else { continue };
        let name = plugin_name(i);
        if permissions(mode, i).check_updates(&name, &update).is_err() {
            continue;
        }
        if result.apply(&name, update).is_err() {
            return;
        }
    }
    let updates = result.into_updates();
    for u in &updates {
        round_trips(u);
    }
    if let Some(id) = target {
        let last = updates.last().expect("UpdateContainer always has the target's entry");
        assert_eq!(last.container_id, id, "the target's entry is last");
    }
}
