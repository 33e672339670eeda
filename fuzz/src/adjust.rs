//! [`Adjuster::adjust`] of an arbitrary OCI spec with an arbitrary
//! adjustment, and [`update`] of its resources.
//!
//! Input: [`parts`](crate::parts): the spec (OCI JSON; an empty or
//! unparsable part picks the busybox fixture or the default spec by its
//! first byte), an encoded `ContainerAdjustment`, an encoded
//! `LinuxResources` for `update`.
//!
//! Properties: no panic; on error the spec is unchanged (adjust is all or
//! nothing); an empty adjustment changes nothing; an adjusted spec
//! serializes to JSON, and when the input spec survived a JSON round trip
//! unchanged the adjusted one does too (what the shim writes is what it
//! adjusted); `update` on error leaves the resources unchanged.

use nri_adaptation::{Adjuster, api, update};
use oci_spec::runtime::{LinuxBlockIo, LinuxDeviceBuilder, LinuxDeviceType, LinuxIntelRdt, Spec};
use protobuf::Message;

/// Whether `spec` comes back equal from JSON.
fn json_round_trips(spec: &Spec) -> bool {
    let json = serde_json::to_vec(spec).expect("a spec serializes");
    serde_json::from_slice::<Spec>(&json).is_ok_and(|back| back == *spec)
}

/// Helpers as a runtime supplies them: CDI names with a `!` fail, the
/// rest inject one device; classes named `bad` fail.
fn adjuster<'a>() -> Adjuster<'a> {
    Adjuster::new()
        .with_cdi_injector(|spec, names| {
            if names.iter().any(|n| n.contains('!')) {
                return Err("unknown CDI device".into());
            }
            let dev = LinuxDeviceBuilder::default()
                .path("/dev/cdi-fuzz")
                .typ(LinuxDeviceType::C)
                .major(1)
                .minor(3)
                .build()
                .map_err(|e| e.to_string())?;
            let linux = spec.linux_mut().get_or_insert_with(Default::default);
            let mut devices = linux.devices().clone().unwrap_or_default();
            devices.push(dev);
            linux.set_devices(Some(devices));
            Ok(())
        })
        .with_blockio_resolver(|class| match class {
            "bad" => Err("unknown class".into()),
            _ => Ok(LinuxBlockIo::default()),
        })
        .with_rdt_resolver(|class| match class {
            "bad" => Err("unknown class".into()),
            _ => Ok(LinuxIntelRdt::default()),
        })
}

/// Runs one input; panics when a property fails.
pub fn run(data: &[u8]) {
    let parts = crate::parts(data);
    let spec_part = parts.first().copied().unwrap_or_default();
    let spec = match serde_json::from_slice::<Spec>(spec_part) {
        Ok(s) => s,
        Err(_) if spec_part.first().is_some_and(|b| b % 2 == 1) => Spec::default(),
        Err(_) => crate::busybox_spec(),
    };
    let Ok(adj) = api::ContainerAdjustment::parse_from_bytes(parts.get(1).copied().unwrap_or_default()) else {
        return;
    };
    let adjuster = adjuster();
    let stable = json_round_trips(&spec);

    let mut same = spec.clone();
    adjuster
        .adjust(&mut same, &api::ContainerAdjustment::new())
        .expect("an empty adjustment applies");
    assert!(same == spec, "an empty adjustment changed the spec");

    let mut adjusted = spec.clone();
    match adjuster.adjust(&mut adjusted, &adj) {
        Err(_) => assert!(adjusted == spec, "a failed adjust changed the spec"),
        Ok(()) => {
            let round_trips = json_round_trips(&adjusted);
            assert!(!stable || round_trips, "the adjusted spec does not survive JSON");
        }
    }

    if let Some(bytes) = parts.get(2)
        && let Ok(res) = api::LinuxResources::parse_from_bytes(bytes)
    {
        let base = adjusted
            .linux()
            .as_ref()
            .and_then(|l| l.resources().clone())
            .unwrap_or_default();
        let _ = nri_adaptation::spec::to_oci_resources(&res);
        let mut target = base.clone();
        if update(&mut target, &res).is_err() {
            assert!(target == base, "a failed update changed the resources");
        }
    }
}
