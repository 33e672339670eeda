//! The field table against the generated messages, and [`overlay`]: every
//! field an update sets reaches the view, every other field survives.
//!
//! The checks read the messages through protobuf reflection, not through
//! the table, so a field the table misses or mishandles shows up here.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use protobuf::{
    MessageFull,
    reflect::{FieldDescriptor, RuntimeFieldType, RuntimeType},
};

use super::{testing::*, *};

fn json<M: MessageFull>(s: &str) -> M {
    protobuf_json_mapping::parse_from_str(s).unwrap_or_else(|e| panic!("bad fixture {s}: {e}"))
}

#[test]
fn the_table_has_every_field_of_the_generated_messages() {
    let mut proto: Vec<String> = proto_leaves().iter().map(|p| dotted(p)).collect();
    proto.sort();
    let mut table: Vec<&str> = FIELDS.iter().map(|f| f.proto).collect();
    table.sort();
    assert_eq!(table, proto);
    let names: BTreeSet<&str> = FIELDS.iter().map(|f| f.name).collect();
    assert_eq!(names.len(), FIELDS.len(), "names are unique");
    let owners: Vec<Field> = FIELDS.iter().filter_map(|f| f.owner).collect();
    let unique: BTreeSet<i32> = owners.iter().map(|f| *f as i32).collect();
    assert_eq!(unique.len(), owners.len(), "owners are unique");
}

#[test]
fn the_sections_are_the_messages_of_several_fields() {
    let md = api::LinuxResources::descriptor();
    let sections: Vec<FieldDescriptor> = md
        .fields()
        .filter(|fd| matches!(fd.runtime_field_type(), RuntimeFieldType::Singular(RuntimeType::Message(m)) if m.fields().count() > 1))
        .collect();
    assert_eq!(sections.len(), SECTIONS.len());
    for fd in sections {
        // An empty section alone: exactly one entry sees it, and an
        // overlay keeps it present.
        let mut r = api::LinuxResources::new();
        fd.mut_message(&mut r);
        assert_eq!(SECTIONS.iter().filter(|s| (s.present)(&r)).count(), 1, "{}", fd.name());
        let mut view = api::LinuxResources::new();
        overlay(&mut view, &r);
        assert_eq!(view, r, "{}", fd.name());
    }
}

#[test]
fn each_table_entry_reads_its_own_field() {
    // Setting one leaf makes exactly its entry report itself set.
    for (i, path) in singular_leaves().iter().enumerate() {
        let mut seeds = vec![None; singular_leaves().len()];
        seeds[i] = Some(Seed {
            int: 7,
            flag: true,
            text: "x".into(),
        });
        let r = build(
            &seeds,
            &Lists {
                hugepages: BTreeMap::new(),
                unified: BTreeMap::new(),
                devices: Vec::new(),
            },
        );
        let set: Vec<&str> = FIELDS.iter().filter(|f| f.is_set(&r)).map(|f| f.proto).collect();
        assert_eq!(set, [dotted(path)]);
    }
}

/// The shim's own overlay dropped these; plugins then saw stale values at
/// Synchronize.
#[test]
fn an_update_of_hugepages_classes_devices_reaches_the_view() {
    let mut view: api::LinuxResources = json(
        r#"{"memory": {"limit": {"value": 100}}, "hugepage_limits": [{"page_size": "2MB", "limit": 1},
            {"page_size": "1GB", "limit": 2}], "unified": {"a": "1"}, "blockio_class": {"value": "low"},
            "devices": [{"allow": false, "access": "rwm"}]}"#,
    );
    let update: api::LinuxResources = json(
        r#"{"hugepage_limits": [{"page_size": "2MB", "limit": 8}], "blockio_class": {"value": "high"},
            "rdt_class": {"value": "gold"}, "unified": {"b": "2"}, "pids": {"limit": 50},
            "devices": [{"allow": true, "type": "c", "major": {"value": 10}, "access": "rw"}]}"#,
    );
    overlay(&mut view, &update);
    assert_eq!(hugepages(&view), BTreeMap::from([("1GB", 2), ("2MB", 8)]));
    assert_eq!(view.blockio_class.value, "high");
    assert_eq!(view.rdt_class.value, "gold");
    assert_eq!(view.pids.limit, 50);
    assert_eq!(view.devices, update.devices);
    assert_eq!(view.unified.len(), 2);
    assert_eq!(view.memory.limit.value, 100);
}

#[test]
fn an_empty_update_changes_nothing() {
    let mut view: api::LinuxResources = json(r#"{"cpu": {"cpus": "0-1"}, "devices": [{"allow": false}]}"#);
    let before = view.clone();
    overlay(&mut view, &api::LinuxResources::new());
    assert_eq!(view, before);
}

#[test]
fn device_rules_append_replace_or_keep() {
    let cur: api::LinuxResources = json(r#"{"devices": [{"allow": false, "access": "rwm"}]}"#);
    let upd: api::LinuxResources = json(r#"{"devices": [{"allow": true, "type": "c", "access": "r"}]}"#);
    let devices = |rules| {
        let mut r = cur.clone();
        overlay_with(&mut r, &upd, rules);
        r.devices.iter().map(|d| d.allow).collect::<Vec<_>>()
    };
    assert_eq!(devices(Rules::Append), [false, true]);
    assert_eq!(devices(Rules::Replace), [true]);
    assert_eq!(devices(Rules::Keep), [false]);
}

#[test]
fn visit_names_each_set_part() {
    let r: api::LinuxResources = json(
        r#"{"cpu": {"quota": {"value": -1}, "mems": "0"}, "hugepage_limits": [{"page_size": "2MB", "limit": 4}],
            "unified": {"io.max": "x"}, "rdt_class": {"value": "c"}, "pids": {"limit": 3},
            "devices": [{"allow": true}]}"#,
    );
    let mut seen = Vec::new();
    visit(&r, |f, e| {
        let v = match e {
            Entry::Scalar(v) => format!("{v:?}"),
            Entry::Keyed(k, v) => format!("{k}={v:?}"),
            Entry::Rules(list) => format!("{} rules", list.len()),
        };
        seen.push(format!("{} {v}", f.name));
    });
    assert_eq!(
        seen,
        [
            "cpu.quota Int(-1)",
            "cpu.mems Str(\"0\")",
            "hugepages 2MB=Uint(4)",
            "unified io.max=Str(\"x\")",
            "rdt_class Str(\"c\")",
            "pids.limit Int(3)",
            "devices 1 rules",
        ]
    );
}

#[test]
fn merge_claims_in_table_order_and_keeps_device_rules_out_of_updates() {
    let mut own = api::FieldOwners::new();
    let upd: api::LinuxResources = json(
        r#"{"memory": {"swap": {"value": 1}}, "pids": {"limit": 2}, "unified": {"k": "v"},
            "devices": [{"allow": true}]}"#,
    );
    let mut base = api::LinuxResources::new();
    merge(&mut own, "10-a", &upd, &mut [&mut base], Rules::Keep).unwrap();
    assert!(base.devices.is_empty());
    assert_eq!(base.pids.limit, 2);
    let e = merge(&mut own, "20-b", &upd, &mut [&mut base], Rules::Keep).unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"plugins "20-b" and "10-a" both tried to set MemSwapLimit"#
    );
}

#[test]
fn upsert_replaces_by_key_at_the_end() {
    let mut list = vec![(1, 'a'), (2, 'b'), (1, 'c')];
    upsert(&mut list, (1, 'd'), |x, y| x.0 == y.0);
    assert_eq!(list, [(2, 'b'), (1, 'd')]);
}

#[test]
fn removal_keys() {
    assert_eq!(removal_key("-a"), Some("a"));
    assert_eq!(removal_key("a"), None);
    assert_eq!(removal_key("-"), None);
}

proptest! {
    /// An update touching any subset of the fields reaches the view; the
    /// untouched fields survive.
    #[test]
    fn overlay_reflects_any_update(before in arb_resources(), update in arb_resources()) {
        let mut after = before.clone();
        overlay(&mut after, &update);
        check_overlay(&before, &update, &after)?;
    }

    /// An update touching every field replaces each of them.
    #[test]
    fn overlay_reflects_an_update_of_every_field(before in arb_resources(), update in arb_full_resources()) {
        for f in FIELDS {
            prop_assert!(f.is_set(&update), "the generator sets {}", f.name);
        }
        let mut after = before.clone();
        overlay(&mut after, &update);
        check_overlay(&before, &update, &after)?;
    }

    /// The create merge writes the same view as the overlay (device rules
    /// appended instead of replaced).
    #[test]
    fn merge_writes_what_overlay_writes(before in arb_resources(), update in arb_resources()) {
        let mut merged = before.clone();
        let mut own = api::FieldOwners::new();
        merge(&mut own, "10-a", &update, &mut [&mut merged], Rules::Append).unwrap();
        let mut overlaid = before.clone();
        overlay_with(&mut overlaid, &update, Rules::Append);
        prop_assert_eq!(merged, overlaid);
    }

    /// What the merge skips: a field the update leaves unset, overlaid and
    /// claimed, changes neither the view nor the ownership records.
    #[test]
    fn an_unset_field_overlays_and_claims_nothing(before in arb_resources(), update in arb_resources()) {
        for f in FIELDS.iter().filter(|f| !f.is_set(&update)) {
            for rules in [Rules::Append, Rules::Replace, Rules::Keep] {
                let mut after = before.clone();
                f.overlay(&mut after, &update, rules);
                prop_assert_eq!(&after, &before, "{} overlaid", f.name);
            }
            let mut own = api::FieldOwners::new();
            f.claim(&update, &mut own, "10-a").unwrap();
            prop_assert_eq!(own, api::FieldOwners::new(), "{} claimed", f.name);
        }
    }

    /// `adjust` and `convert` agree: OCI resources from NRI ones read back
    /// as the same NRI resources (the classes have no OCI form).
    #[test]
    fn oci_round_trip(mut r in arb_resources()) {
        r.blockio_class.clear();
        r.rdt_class.clear();
        let oci = crate::spec::to_oci_resources(&r);
        prop_assume!(oci.is_ok(), "a value the kernel rejects");
        r.memory.mut_or_insert_default();
        r.cpu.mut_or_insert_default();
        prop_assert_eq!(crate::convert::resources_from_oci(&oci.unwrap()), r);
    }
}
