//! The fields of NRI's `LinuxResources`, described once, and the generic
//! merges of the adjustment shapes that recur across the protocol.
//!
//! [`FIELDS`] lists every resource field: its name as plugins and logs see
//! it (`memory.limit`, `cpu.cpus`, `hugepages`, `pids.limit`), the ownership
//! [`Field`] the merge claims, its [`Shape`], and how it is read, overlaid
//! and converted to and from the OCI runtime spec. The merge
//! (in `Adaptation::create_container`), [`crate::spec::adjust`], [`crate::convert`],
//! [`overlay`] (a runtime's NRI view after an update) and [`visit`] (logs)
//! all walk this table, so a field the protocol adds is described here
//! once; a test fails while the table misses a field of the generated
//! messages.
//!
//! Shapes and the rule an update follows (a string scalar such as
//! `cpu.cpus` is set when non-empty):
//!
//! | shape | fields | an update |
//! |---|---|---|
//! | [`Shape::Scalar`] | `memory.*`, `cpu.*`, `blockio_class`, `rdt_class`, `pids.limit` | a set value replaces |
//! | [`Shape::KeyedList`] | `hugepages` (by page size) | an entry replaces the one with its key, or is appended |
//! | [`Shape::Map`] | `unified` | each key is set |
//! | [`Shape::Rules`] | `devices` (cgroup device rules, no key) | see [`Rules`] |
//!
//! The table's order is the merge's claim order, which decides which of
//! several conflicts is reported.
//!
//! Outside resources, two adjustment shapes carry `-key` removals: maps
//! (annotations, sysctl, net devices) and keyed lists (env by name, mounts
//! by destination, devices by path). [`removal_key`] reads the marker,
//! [`upsert`] replaces a keyed list's entry, and the merge of each shape
//! is one function (crate-private: it writes ownership records).

use nri_proto::api::{self, Field};
use oci_spec::runtime as oci;

pub(crate) use self::keyed::{Keyed, apply_map, merge_keyed, merge_map};
use self::table::SECTIONS;
pub use self::{
    keyed::{removal_key, upsert},
    table::FIELDS,
};
use crate::{result::MergeError, result::owners::Records, spec::AdjustError};

mod keyed;
mod table;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

/// How a resource field is laid out, and so how it is merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One optional value; one owner.
    Scalar,
    /// A list with one entry per key; one owner per key.
    KeyedList,
    /// A string map; one owner per key.
    Map,
    /// A list without keys, never claimed (cgroup device rules).
    Rules,
}

/// The value of a scalar field, or of one key of a keyed field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A signed number (byte counts, quotas; `-1` often means unlimited).
    Int(i64),
    /// An unsigned number (shares, periods, hugepage limits).
    Uint(u64),
    /// A flag.
    Bool(bool),
    /// A string (cpu sets, class names, unified values).
    Str(String),
}

/// One set part of a resource field, as [`visit`] reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry<'a> {
    /// A scalar's value.
    Scalar(Value),
    /// One key of a keyed list or map, and its value.
    Keyed(&'a str, Value),
    /// The device cgroup rules.
    Rules(&'a [api::LinuxDeviceCgroup]),
}

/// How the device cgroup rules of an update combine with the current ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rules {
    /// Added after the current rules (a plugin's adjustment at creation).
    Append,
    /// Replace the current rules when the update has any: an update's
    /// resources carry the complete rule set.
    Replace,
    /// Left as they are (the merge of container updates, as upstream).
    Keep,
}

type Visit = for<'r> fn(&'r api::LinuxResources, &mut dyn FnMut(Entry<'r>));
type Claim = fn(&api::LinuxResources, &mut dyn Records, Field, &str) -> Result<(), MergeError>;
type Overlay = fn(&mut api::LinuxResources, &api::LinuxResources, Rules);
type ToOci = fn(&api::LinuxResources, &mut oci::LinuxResources) -> Result<(), AdjustError>;
type FromOci = fn(&oci::LinuxResources, &mut api::LinuxResources);

/// The OCI counterpart of a field inside `linux.resources` (block I/O and
/// RDT classes have none: a runtime resolves them).
struct Oci {
    write: ToOci,
    read: FromOci,
}

/// One field of `LinuxResources`; see the module docs.
pub struct ResourceField {
    /// The name plugins and logs see: `memory.limit`, `hugepages`.
    pub name: &'static str,
    /// The dotted protobuf path of what the entry covers: `memory.limit`,
    /// `hugepage_limits`, `pids` (the whole `LinuxPids` message).
    pub proto: &'static str,
    /// The ownership record the merge claims (`None`: never claimed).
    pub owner: Option<Field>,
    /// The layout.
    pub shape: Shape,
    is_set: fn(&api::LinuxResources) -> bool,
    visit: Visit,
    claim: Claim,
    overlay: Overlay,
    oci: Option<Oci>,
}

impl std::fmt::Debug for ResourceField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceField")
            .field("name", &self.name)
            .field("owner", &self.owner)
            .field("shape", &self.shape)
            .finish_non_exhaustive()
    }
}

impl ResourceField {
    /// Whether `r` sets this field (a scalar present, a list or map
    /// non-empty).
    pub fn is_set(&self, r: &api::LinuxResources) -> bool {
        (self.is_set)(r)
    }

    /// Reports the set parts of this field in `r` (nothing when unset).
    pub fn visit<'r>(&self, r: &'r api::LinuxResources, f: &mut dyn FnMut(Entry<'r>)) {
        (self.visit)(r, f)
    }

    /// Overlays this field of `update` on `current`, following its shape's
    /// rule (see the module docs); device rules as `rules` says.
    pub fn overlay(&self, current: &mut api::LinuxResources, update: &api::LinuxResources, rules: Rules) {
        (self.overlay)(current, update, rules)
    }

    /// Whether the field lives in the OCI `linux.resources`.
    pub fn in_oci_resources(&self) -> bool {
        self.oci.is_some()
    }

    /// Records `plugin` as owner of what `r` sets of this field.
    pub(crate) fn claim(&self, r: &api::LinuxResources, own: &mut dyn Records, plugin: &str) -> Result<(), MergeError> {
        match self.owner {
            Some(field) => (self.claim)(r, own, field, plugin),
            None => Ok(()),
        }
    }

    /// Writes this field of `r` into OCI resources, checking the values
    /// the kernel would reject.
    pub(crate) fn write_oci(
        &self,
        r: &api::LinuxResources,
        target: &mut oci::LinuxResources,
    ) -> Result<(), AdjustError> {
        match &self.oci {
            Some(o) => (o.write)(r, target),
            None => Ok(()),
        }
    }

    /// Reads this field from OCI resources into `target`.
    pub(crate) fn read_oci(&self, r: &oci::LinuxResources, target: &mut api::LinuxResources) {
        if let Some(o) = &self.oci {
            (o.read)(r, target)
        }
    }
}

/// Reports every set part of `r`, field by field in table order.
///
/// ```
/// use nri_adaptation::{api, resources::{self, Entry, Value}};
/// let mut r = api::LinuxResources::new();
/// r.memory.mut_or_insert_default().limit.mut_or_insert_default().value = 128;
/// let mut seen = Vec::new();
/// resources::visit(&r, |f, e| seen.push((f.name, e.clone())));
/// assert_eq!(seen, [("memory.limit", Entry::Scalar(Value::Int(128)))]);
/// ```
pub fn visit<'r>(r: &'r api::LinuxResources, mut f: impl FnMut(&'static ResourceField, Entry<'r>)) {
    for field in FIELDS {
        field.visit(r, &mut |e| f(field, e));
    }
}

/// Overlays every field present in `update` on `current`: scalars that
/// `update` sets replace, hugepage limits replace the one of their page
/// size, unified keys are set, and device rules, when `update` has any,
/// replace the current ones (an update carries the complete rule set).
/// Fields `update` leaves unset keep their value.
///
/// This is how a runtime keeps its NRI view of a container (what plugins
/// see at Synchronize and in later events) in step with an update it
/// applied.
///
/// ```
/// use nri_adaptation::{api, resources::overlay};
/// let mut current = api::LinuxResources::new();
/// current.cpu.mut_or_insert_default().cpus = "0-3".into();
/// let mut update = api::LinuxResources::new();
/// update.rdt_class.mut_or_insert_default().value = "gold".into();
/// overlay(&mut current, &update);
/// assert_eq!(current.rdt_class.value, "gold");
/// assert_eq!(current.cpu.cpus, "0-3");
/// ```
pub fn overlay(current: &mut api::LinuxResources, update: &api::LinuxResources) {
    overlay_with(current, update, Rules::Replace);
}

/// [`overlay`] with device rules combined as `rules` says.
pub fn overlay_with(current: &mut api::LinuxResources, update: &api::LinuxResources, rules: Rules) {
    open_sections(current, update);
    for f in FIELDS {
        f.overlay(current, update, rules);
    }
}

/// Claims every field `update` sets for `plugin` (field by field, in table
/// order), overlaying each on every target after its claim.
pub(crate) fn merge(
    own: &mut dyn Records,
    plugin: &str,
    update: &api::LinuxResources,
    targets: &mut [&mut api::LinuxResources],
    rules: Rules,
) -> Result<(), MergeError> {
    for t in targets.iter_mut() {
        open_sections(t, update);
    }
    // A field the update leaves unset claims and overlays nothing: one
    // check instead of a claim and an overlay per target for each of the
    // twenty-odd fields, of which an answer sets a few.
    for f in FIELDS.iter().filter(|f| f.is_set(update)) {
        f.claim(update, own, plugin)?;
        for t in targets.iter_mut() {
            f.overlay(t, update, rules);
        }
    }
    Ok(())
}

/// NRI resources from OCI resources: every field with an OCI counterpart
/// (all but the block I/O and RDT classes), and the sections (`memory`,
/// `cpu`) the OCI resources have, even empty.
pub(crate) fn read_oci(r: &oci::LinuxResources) -> api::LinuxResources {
    let mut out = api::LinuxResources::new();
    for s in SECTIONS.iter().filter(|s| (s.in_oci)(r)) {
        (s.open)(&mut out);
    }
    for f in FIELDS {
        f.read_oci(r, &mut out);
    }
    out
}

/// Sections `update` has stay present in `target` even when empty.
fn open_sections(target: &mut api::LinuxResources, update: &api::LinuxResources) {
    for s in SECTIONS.iter().filter(|s| (s.present)(update)) {
        (s.open)(target);
    }
}

#[cfg(test)]
mod tests;
