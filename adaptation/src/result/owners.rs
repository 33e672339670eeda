//! Field ownership: which plugin set (or cleared) which field of which
//! container during one runtime request (NRI `pkg/api/owners.go`).
//!
//! Owners are recorded per container id in an [`api::OwningPlugins`], the
//! same message validators receive. An owner string is the plugin's
//! `IDX-NAME`; `-IDX-NAME` means the plugin *cleared* the field (removed the
//! key), which lets only that plugin set it again; OCI hooks accumulate
//! owners as `A,B,C` and never conflict.

use nri_proto::api::{self, Field};

use crate::result::MergeError;

/// Ownership records of one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Owners {
    inner: api::OwningPlugins,
}

fn marked(owner: &str) -> Option<&str> {
    owner.strip_prefix('-').filter(|s| !s.is_empty())
}

impl Owners {
    /// No owners yet.
    pub fn new() -> Self {
        Owners::default()
    }

    /// Wraps records received in a validation request.
    pub fn from_proto(inner: api::OwningPlugins) -> Self {
        Owners { inner }
    }

    /// Every key's owner of a compound field of container `id`.
    pub fn compound_owners(&self, id: &str, field: Field) -> Option<&std::collections::HashMap<String, String>> {
        Some(&self.inner.owners.get(id)?.compound.get(&(field as i32))?.owners)
    }

    /// The records as the protocol message sent to validators.
    pub fn as_proto(&self) -> &api::OwningPlugins {
        &self.inner
    }

    /// Consumes into the protocol message.
    pub fn into_proto(self) -> api::OwningPlugins {
        self.inner
    }

    fn of(&mut self, id: &str) -> &mut api::FieldOwners {
        // Look up first: allocating the key on every claim is the merge's
        // most frequent cost.
        if !self.inner.owners.contains_key(id) {
            self.inner.owners.insert(id.to_string(), api::FieldOwners::new());
        }
        self.inner.owners.get_mut(id).expect("inserted above")
    }

    /// Owner of a simple field of container `id`, if any.
    pub fn simple_owner(&self, id: &str, field: Field) -> Option<&str> {
        self.inner
            .owners
            .get(id)?
            .simple
            .get(&(field as i32))
            .map(String::as_str)
    }

    /// Owner of `key` of a compound field of container `id`, if any.
    pub fn compound_owner(&self, id: &str, field: Field, key: &str) -> Option<&str> {
        self.inner
            .owners
            .get(id)?
            .compound
            .get(&(field as i32))?
            .owners
            .get(key)
            .map(String::as_str)
    }

    /// Records `plugin` as owner of a simple field.
    ///
    /// # Errors
    /// [`MergeError::Conflict`] when another plugin owns it, or cleared it,
    /// or when `plugin` itself already set it (claims are not idempotent,
    /// as upstream: sending the same field twice is a conflict).
    pub fn claim_simple(&mut self, id: &str, field: Field, plugin: &str) -> Result<(), MergeError> {
        self.of(id).claim_simple(field, plugin)
    }

    /// Records `plugin` as owner of `key` of a compound field.
    ///
    /// # Errors
    /// As [`Owners::claim_simple`], per key.
    pub fn claim_compound(&mut self, id: &str, field: Field, key: &str, plugin: &str) -> Result<(), MergeError> {
        self.of(id).claim_compound(field, key, plugin)
    }

    /// Marks a simple field as cleared by `plugin` (no conflict check).
    pub fn clear_simple(&mut self, id: &str, field: Field, plugin: &str) {
        self.of(id).clear_simple(field, plugin)
    }

    /// Marks `key` of a compound field as cleared by `plugin`.
    pub fn clear_compound(&mut self, id: &str, field: Field, key: &str, plugin: &str) {
        self.of(id).clear_compound(field, key, plugin)
    }

    /// Adds `plugin` to the accumulated owners of a field (OCI hooks).
    pub fn accumulate(&mut self, id: &str, field: Field, plugin: &str) {
        self.of(id).accumulate(field, plugin)
    }

    /// The records of container `id`, created empty on first use.
    pub(crate) fn field_owners_mut(&mut self, id: &str) -> &mut api::FieldOwners {
        self.of(id)
    }

    /// Sets the records of container `id` wholesale.
    pub(crate) fn set(&mut self, id: &str, owners: api::FieldOwners) {
        self.inner.owners.insert(id.to_string(), owners);
    }
}

fn conflict(plugin: &str, other: &str, field: Field, key: Option<&str>) -> Option<MergeError> {
    let other = match marked(other) {
        Some(clearer) if clearer == plugin => return None,
        Some(clearer) => clearer,
        None => other,
    };
    Some(MergeError::Conflict {
        plugin: plugin.to_string(),
        other: other.to_string(),
        field,
        key: key.map(str::to_string),
    })
}

/// Ownership records of one container's fields, as the merge writes them.
///
/// Implemented by the protocol message (`api::FieldOwners`, used for
/// updates of other containers) and by [`FieldTable`], the compact table a
/// CreateContainer merge uses for the created container.
pub(crate) trait Records {
    /// See [`Owners::claim_simple`].
    fn claim_simple(&mut self, field: Field, plugin: &str) -> Result<(), MergeError>;
    /// See [`Owners::claim_compound`].
    fn claim_compound(&mut self, field: Field, key: &str, plugin: &str) -> Result<(), MergeError>;
    /// See [`Owners::clear_simple`].
    fn clear_simple(&mut self, field: Field, plugin: &str);
    /// See [`Owners::clear_compound`].
    fn clear_compound(&mut self, field: Field, key: &str, plugin: &str);
    /// See [`Owners::accumulate`].
    fn accumulate(&mut self, field: Field, plugin: &str);
}

impl Records for api::FieldOwners {
    fn claim_simple(&mut self, field: Field, plugin: &str) -> Result<(), MergeError> {
        if let Some(other) = self.simple.get(&(field as i32))
            && let Some(e) = conflict(plugin, other, field, None)
        {
            return Err(e);
        }
        self.simple.insert(field as i32, plugin.to_string());
        Ok(())
    }

    fn claim_compound(&mut self, field: Field, key: &str, plugin: &str) -> Result<(), MergeError> {
        let m = self.compound.entry(field as i32).or_default();
        match m.owners.get_mut(key) {
            Some(other) => match conflict(plugin, other, field, Some(key)) {
                Some(e) => Err(e),
                None => {
                    plugin.clone_into(other);
                    Ok(())
                }
            },
            None => {
                m.owners.insert(key.to_string(), plugin.to_string());
                Ok(())
            }
        }
    }

    fn clear_simple(&mut self, field: Field, plugin: &str) {
        self.simple.insert(field as i32, format!("-{plugin}"));
    }

    fn clear_compound(&mut self, field: Field, key: &str, plugin: &str) {
        self.compound
            .entry(field as i32)
            .or_default()
            .owners
            .insert(key.to_string(), format!("-{plugin}"));
    }

    fn accumulate(&mut self, field: Field, plugin: &str) {
        let entry = self.simple.entry(field as i32).or_default();
        if !entry.is_empty() {
            entry.push(',');
        }
        entry.push_str(plugin);
    }
}

/// Who owns a field in a [`FieldTable`]: an index into its plugin names,
/// and whether that plugin cleared (rather than set) the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owner {
    plugin: u16,
    cleared: bool,
}

/// Compact ownership records of the container a CreateContainer merge
/// creates: plugins are interned once, so a claim allocates at most the key
/// (the protocol message allocates an owner string per claim and hashes the
/// field number into a map). Converted to `api::FieldOwners` for
/// validators and reports with [`FieldTable::to_proto`].
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldTable {
    plugins: Vec<String>,
    simple: Vec<(Field, Owner)>,
    accumulated: Vec<(Field, Vec<u16>)>,
    /// Every claimed key of every compound field, in claim order. A linear
    /// scan: a merge sees tens of keys, where hashing and growing a map per
    /// field cost more than comparing. Each key carries its [`tag`], so the
    /// scan compares two words per entry and the key's bytes only on a match.
    compound: Vec<Claimed>,
    /// The text of every claimed key, one after the other: one buffer that
    /// grows by doubling instead of an allocation per key.
    keys: String,
}

/// One claimed key of a compound field in a [`FieldTable`].
#[derive(Debug, Clone, PartialEq)]
struct Claimed {
    tag: u64,
    field: Field,
    /// Where the key's text is in [`FieldTable::keys`].
    at: std::ops::Range<usize>,
    owner: Owner,
}

/// A key's scan tag: its field and an FNV-1a hash of its bytes. Keys of
/// one field (env names, mount destinations) often share their length and
/// a long prefix, so comparing bytes for every entry costs a `memcmp` call
/// each; a tag mismatch settles almost all of them in one compare.
fn tag(field: Field, key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ field as u64;
    for b in key.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl FieldTable {
    /// The plugin's index, interning it on first use. Claims of one
    /// response come from the plugin interned last: one compare.
    fn intern(&mut self, plugin: &str) -> u16 {
        if let Some(i) = self.plugins.iter().rposition(|p| p == plugin) {
            return i as u16;
        }
        self.plugins.push(plugin.to_string());
        (self.plugins.len() - 1) as u16
    }

    fn name(&self, o: Owner) -> String {
        let name = &self.plugins[o.plugin as usize];
        if o.cleared { format!("-{name}") } else { name.clone() }
    }

    /// Checks a claim by `plugin` (interned as `me`) against the current
    /// owner `o`: only the plugin that cleared a field may set it again.
    fn check(&self, o: Owner, me: u16, plugin: &str, field: Field, key: Option<&str>) -> Result<(), MergeError> {
        if o.cleared && o.plugin == me {
            return Ok(());
        }
        Err(MergeError::Conflict {
            plugin: plugin.to_string(),
            other: self.plugins[o.plugin as usize].clone(),
            field,
            key: key.map(str::to_string),
        })
    }

    /// The entry of `key` of `field`, found by its tag `t`.
    fn key_index(&self, t: u64, field: Field, key: &str) -> Option<usize> {
        self.compound
            .iter()
            .position(|c| c.tag == t && c.field == field && self.keys[c.at.clone()] == *key)
    }

    fn set_key(&mut self, field: Field, key: &str, o: Owner) {
        let t = tag(field, key);
        match self.key_index(t, field, key) {
            Some(i) => self.compound[i].owner = o,
            None => self.push_key(t, field, key, o),
        }
    }

    /// Adds a key known to be absent.
    fn push_key(&mut self, tag: u64, field: Field, key: &str, owner: Owner) {
        if self.compound.capacity() == 0 {
            self.compound.reserve(16);
        }
        if self.keys.capacity() == 0 {
            self.keys.reserve(256);
        }
        let start = self.keys.len();
        self.keys.push_str(key);
        self.compound.push(Claimed {
            tag,
            field,
            at: start..self.keys.len(),
            owner,
        });
    }

    fn set_simple(&mut self, field: Field, o: Owner) {
        match self.simple.iter_mut().find(|(f, _)| *f == field) {
            Some((_, cur)) => *cur = o,
            None => self.simple.push((field, o)),
        }
    }

    /// The records as the protocol message (owner strings `IDX-NAME`,
    /// `-IDX-NAME` when cleared, `A,B` when accumulated).
    pub(crate) fn to_proto(&self) -> api::FieldOwners {
        let mut f = api::FieldOwners::new();
        for (field, o) in &self.simple {
            f.simple.insert(*field as i32, self.name(*o));
        }
        for (field, ps) in &self.accumulated {
            let names: Vec<&str> = ps.iter().map(|p| self.plugins[*p as usize].as_str()).collect();
            f.simple.insert(*field as i32, names.join(","));
        }
        for c in &self.compound {
            f.compound
                .entry(c.field as i32)
                .or_default()
                .owners
                .insert(self.keys[c.at.clone()].to_string(), self.name(c.owner));
        }
        f
    }
}

impl Records for FieldTable {
    fn claim_simple(&mut self, field: Field, plugin: &str) -> Result<(), MergeError> {
        let me = self.intern(plugin);
        if let Some((_, o)) = self.simple.iter().find(|(f, _)| *f == field) {
            self.check(*o, me, plugin, field, None)?;
        }
        self.set_simple(
            field,
            Owner {
                plugin: me,
                cleared: false,
            },
        );
        Ok(())
    }

    fn claim_compound(&mut self, field: Field, key: &str, plugin: &str) -> Result<(), MergeError> {
        let me = self.intern(plugin);
        let owner = Owner {
            plugin: me,
            cleared: false,
        };
        let t = tag(field, key);
        match self.key_index(t, field, key) {
            Some(i) => {
                self.check(self.compound[i].owner, me, plugin, field, Some(key))?;
                self.compound[i].owner = owner;
            }
            None => self.push_key(t, field, key, owner),
        }
        Ok(())
    }

    fn clear_simple(&mut self, field: Field, plugin: &str) {
        let me = self.intern(plugin);
        self.set_simple(
            field,
            Owner {
                plugin: me,
                cleared: true,
            },
        );
    }

    fn clear_compound(&mut self, field: Field, key: &str, plugin: &str) {
        let me = self.intern(plugin);
        self.set_key(
            field,
            key,
            Owner {
                plugin: me,
                cleared: true,
            },
        );
    }

    fn accumulate(&mut self, field: Field, plugin: &str) {
        let me = self.intern(plugin);
        match self.accumulated.iter_mut().find(|(f, _)| *f == field) {
            Some((_, ps)) => ps.push(me),
            None => self.accumulated.push((field, vec![me])),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One recorded operation: kind (0 claim simple, 1 claim compound,
    /// 2 clear simple, 3 clear compound, 4 accumulate), field, key, plugin.
    fn op() -> impl Strategy<Value = (u8, u8, &'static str, &'static str)> {
        (
            0u8..5,
            0u8..3,
            prop::sample::select(vec!["A", "B", "C"]),
            prop::sample::select(vec!["10-a", "20-b", "30-c"]),
        )
    }

    fn field(i: u8, kind: u8) -> Field {
        if kind == 4 {
            return Field::OciHooks;
        }
        [Field::Env, Field::Mounts, Field::CPUShares][i as usize]
    }

    fn run(r: &mut dyn Records, ops: &[(u8, u8, &str, &str)]) -> Vec<Result<(), MergeError>> {
        ops.iter()
            .map(|&(kind, f, key, plugin)| {
                let f = field(f, kind);
                match kind {
                    0 => return r.claim_simple(f, plugin),
                    1 => return r.claim_compound(f, key, plugin),
                    2 => r.clear_simple(f, plugin),
                    3 => r.clear_compound(f, key, plugin),
                    _ => r.accumulate(f, plugin),
                }
                Ok(())
            })
            .collect()
    }

    proptest! {
        /// The compact table decides every claim exactly as the protocol
        /// records do (same conflicts, same error texts) and converts to
        /// the same message.
        #[test]
        fn field_table_matches_protocol_records(ops in prop::collection::vec(op(), 0..40)) {
            let mut proto = api::FieldOwners::new();
            let mut table = FieldTable::default();
            let want = run(&mut proto, &ops);
            let got = run(&mut table, &ops);
            prop_assert_eq!(got, want);
            prop_assert_eq!(table.to_proto(), proto);
        }
    }

    #[test]
    fn claims_conflict_clears_allow_only_the_clearer() {
        let mut o = Owners::new();
        o.claim_simple("c1", Field::CPUShares, "10-a").unwrap();
        let e = o.claim_simple("c1", Field::CPUShares, "20-b").unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"plugins "20-b" and "10-a" both tried to set CPUShares"#
        );
        // M-1: claims are not idempotent.
        assert!(o.claim_simple("c1", Field::CPUShares, "10-a").is_err());
        // Other containers are independent.
        o.claim_simple("c2", Field::CPUShares, "20-b").unwrap();

        o.claim_compound("c1", Field::Env, "FOO", "10-a").unwrap();
        o.clear_compound("c1", Field::Env, "FOO", "20-b");
        assert_eq!(o.compound_owner("c1", Field::Env, "FOO"), Some("-20-b"));
        let e = o.claim_compound("c1", Field::Env, "FOO", "30-c").unwrap_err();
        assert_eq!(e.to_string(), r#"plugins "30-c" and "20-b" both tried to set Env FOO"#);
        o.claim_compound("c1", Field::Env, "FOO", "20-b").unwrap();
        assert_eq!(o.compound_owner("c1", Field::Env, "FOO"), Some("20-b"));

        o.accumulate("c1", Field::OciHooks, "10-a");
        o.accumulate("c1", Field::OciHooks, "20-b");
        assert_eq!(o.simple_owner("c1", Field::OciHooks), Some("10-a,20-b"));
    }
}
