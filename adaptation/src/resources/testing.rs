//! Generators of arbitrary NRI resources and the check that an overlay
//! reflects an update (feature `testing`): for property tests here and in
//! runtimes that keep an NRI view of their containers (the shim).
//!
//! The check reads the messages through protobuf reflection, not through
//! the field table, so a field the table misses or mishandles shows up.

use std::collections::BTreeMap;

use proptest::prelude::*;
use protobuf::{
    MessageDyn, MessageField, MessageFull,
    reflect::{FieldDescriptor, MessageDescriptor, ReflectValueBox, RuntimeFieldType, RuntimeType},
};

use crate::api;

/// Every field of `LinuxResources` as protobuf describes it, as the path of
/// fields leading to it. Sections (`memory`, `cpu`: messages of several
/// fields) are descended into; value wrappers and `pids` are leaves.
pub(crate) fn proto_leaves() -> Vec<Vec<FieldDescriptor>> {
    fn walk(md: &MessageDescriptor, prefix: &[FieldDescriptor], out: &mut Vec<Vec<FieldDescriptor>>) {
        for fd in md.fields() {
            let mut path = prefix.to_vec();
            path.push(fd.clone());
            match fd.runtime_field_type() {
                RuntimeFieldType::Singular(RuntimeType::Message(m)) if m.fields().count() > 1 => walk(&m, &path, out),
                _ => out.push(path),
            }
        }
    }
    let mut out = Vec::new();
    walk(&api::LinuxResources::descriptor(), &[], &mut out);
    out
}

pub(crate) fn dotted(path: &[FieldDescriptor]) -> String {
    path.iter().map(|f| f.name()).collect::<Vec<_>>().join(".")
}

/// A singular leaf's value in `m`; `None` when its section is absent or it
/// is unset (proto3 reflection reports an empty string as unset).
fn leaf_value(m: &dyn MessageDyn, path: &[FieldDescriptor]) -> Option<ReflectValueBox> {
    match path {
        [fd] => fd.get_singular(m).map(|v| v.to_box()),
        [section, rest @ ..] => {
            if !section.has_field(m) {
                return None;
            }
            leaf_value(&*section.get_message(m), rest)
        }
        [] => unreachable!("empty path"),
    }
}

/// A value for a leaf, from one seed per kind.
#[derive(Debug, Clone)]
pub(crate) struct Seed {
    pub(crate) int: i64,
    pub(crate) flag: bool,
    pub(crate) text: String,
}

fn boxed(t: &RuntimeType, s: &Seed) -> ReflectValueBox {
    match t {
        RuntimeType::I64 => ReflectValueBox::I64(s.int),
        RuntimeType::U64 => ReflectValueBox::U64(s.int.unsigned_abs()),
        RuntimeType::Bool => ReflectValueBox::Bool(s.flag),
        RuntimeType::String => ReflectValueBox::String(s.text.clone()),
        RuntimeType::Message(md) => {
            // A value wrapper (`OptionalInt64`, ...) or `LinuxPids`: one field.
            let mut msg = md.new_instance();
            let mut fields = md.fields();
            let inner = fields.next().expect("a wrapper has a field");
            assert!(fields.next().is_none(), "{} is not a wrapper", md.name());
            inner.set_singular_field(&mut *msg, boxed(&inner.singular_runtime_type(), s));
            ReflectValueBox::Message(msg)
        }
        other => panic!("no generator for a {other} leaf: extend `boxed`"),
    }
}

fn set_leaf(m: &mut dyn MessageDyn, path: &[FieldDescriptor], s: &Seed) {
    match path {
        [fd] => fd.set_singular_field(m, boxed(&fd.singular_runtime_type(), s)),
        [section, rest @ ..] => set_leaf(section.mut_message(m), rest, s),
        [] => unreachable!("empty path"),
    }
}

pub(crate) fn singular_leaves() -> Vec<Vec<FieldDescriptor>> {
    proto_leaves()
        .into_iter()
        .filter(|p| p.last().expect("non-empty").is_singular())
        .collect()
}

/// The lists and maps, written by hand: each has its own overlay rule.
#[derive(Debug, Clone)]
pub(crate) struct Lists {
    pub(crate) hugepages: BTreeMap<String, u64>,
    pub(crate) unified: BTreeMap<String, String>,
    pub(crate) devices: Vec<(bool, String, Option<i64>, String)>,
}

pub(crate) fn build(scalars: &[Option<Seed>], lists: &Lists) -> api::LinuxResources {
    let mut r = api::LinuxResources::new();
    for (path, seed) in singular_leaves().iter().zip(scalars) {
        if let Some(s) = seed {
            set_leaf(&mut r, path, s);
        }
    }
    for (page_size, limit) in &lists.hugepages {
        r.hugepage_limits.push(api::HugepageLimit {
            page_size: page_size.clone(),
            limit: *limit,
            ..Default::default()
        });
    }
    r.unified.extend(lists.unified.clone());
    for (allow, type_, major, access) in &lists.devices {
        r.devices.push(api::LinuxDeviceCgroup {
            allow: *allow,
            type_: type_.clone(),
            major: MessageField::from_option(major.map(|value| api::OptionalInt64 {
                value,
                ..Default::default()
            })),
            access: access.clone(),
            ..Default::default()
        });
    }
    r
}

fn arb_seed() -> impl Strategy<Value = Seed> {
    (-1i64..5000, any::<bool>(), "[a-z0-9,-]{1,6}").prop_map(|(int, flag, text)| Seed { int, flag, text })
}

fn arb_lists() -> impl Strategy<Value = Lists> {
    (
        proptest::collection::btree_map(prop::sample::select(vec!["64KB", "2MB", "1GB"]), 0u64..1 << 40, 0..3),
        proptest::collection::btree_map("[a-c]\\.[a-c]", "[0-9]{1,3}", 0..3),
        proptest::collection::vec(
            (
                any::<bool>(),
                prop::sample::select(vec!["a", "b", "c"]),
                proptest::option::of(0i64..300),
                "[rwm]{0,3}",
            ),
            0..3,
        ),
    )
        .prop_map(|(hugepages, unified, devices)| Lists {
            hugepages: hugepages.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            unified,
            devices: devices
                .into_iter()
                .map(|(allow, t, major, access)| (allow, t.to_string(), major, access))
                .collect(),
        })
}

/// Resources with any subset of the fields set.
pub fn arb_resources() -> impl Strategy<Value = api::LinuxResources> {
    let n = singular_leaves().len();
    (
        proptest::collection::vec(proptest::option::of(arb_seed()), n),
        arb_lists(),
    )
        .prop_map(|(scalars, lists)| build(&scalars, &lists))
}

/// Resources with every field set.
pub fn arb_full_resources() -> impl Strategy<Value = api::LinuxResources> {
    let n = singular_leaves().len();
    let nonempty = arb_lists().prop_filter("every list set", |l| {
        !l.hugepages.is_empty() && !l.unified.is_empty() && !l.devices.is_empty()
    });
    (proptest::collection::vec(arb_seed().prop_map(Some), n), nonempty)
        .prop_map(|(scalars, lists)| build(&scalars, &lists))
}

pub(crate) fn hugepages(r: &api::LinuxResources) -> BTreeMap<&str, u64> {
    r.hugepage_limits
        .iter()
        .map(|h| (h.page_size.as_str(), h.limit))
        .collect()
}

/// Checks `after == before` overlaid with `update`, field by field of the
/// generated message.
pub fn check_overlay(
    before: &api::LinuxResources,
    update: &api::LinuxResources,
    after: &api::LinuxResources,
) -> Result<(), TestCaseError> {
    for path in proto_leaves() {
        let name = dotted(&path);
        let leaf = path.last().expect("non-empty");
        if leaf.is_singular() {
            let want = leaf_value(update, &path).or_else(|| leaf_value(before, &path));
            prop_assert_eq!(leaf_value(after, &path), want, "{}", name);
            continue;
        }
        match name.as_str() {
            "hugepage_limits" => {
                let mut want = hugepages(before);
                want.extend(hugepages(update));
                prop_assert_eq!(hugepages(after), want, "{}", name);
                prop_assert_eq!(
                    after.hugepage_limits.len(),
                    hugepages(after).len(),
                    "one limit per page size"
                );
            }
            "unified" => {
                let mut want = before.unified.clone();
                want.extend(update.unified.clone());
                prop_assert_eq!(&after.unified, &want, "{}", name);
            }
            "devices" => {
                let want = if update.devices.is_empty() {
                    &before.devices
                } else {
                    &update.devices
                };
                prop_assert_eq!(&after.devices, want, "{}", name);
            }
            other => panic!("list field {other} has no overlay rule in this test: add it"),
        }
    }
    Ok(())
}
