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
        claim_simple(self.of(id), field, plugin)
    }

    /// Records `plugin` as owner of `key` of a compound field.
    ///
    /// # Errors
    /// As [`Owners::claim_simple`], per key.
    pub fn claim_compound(&mut self, id: &str, field: Field, key: &str, plugin: &str) -> Result<(), MergeError> {
        claim_compound(self.of(id), field, key, plugin)
    }

    /// Marks a simple field as cleared by `plugin` (no conflict check).
    pub fn clear_simple(&mut self, id: &str, field: Field, plugin: &str) {
        clear_simple(self.of(id), field, plugin)
    }

    /// Marks `key` of a compound field as cleared by `plugin`.
    pub fn clear_compound(&mut self, id: &str, field: Field, key: &str, plugin: &str) {
        clear_compound(self.of(id), field, key, plugin)
    }

    /// Adds `plugin` to the accumulated owners of a field (OCI hooks).
    pub fn accumulate(&mut self, id: &str, field: Field, plugin: &str) {
        accumulate(self.of(id), field, plugin)
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

/// [`Owners::claim_simple`] on one container's records.
pub(crate) fn claim_simple(f: &mut api::FieldOwners, field: Field, plugin: &str) -> Result<(), MergeError> {
    if let Some(other) = f.simple.get(&(field as i32))
        && let Some(e) = conflict(plugin, other, field, None)
    {
        return Err(e);
    }
    f.simple.insert(field as i32, plugin.to_string());
    Ok(())
}

/// [`Owners::claim_compound`] on one container's records.
pub(crate) fn claim_compound(
    f: &mut api::FieldOwners,
    field: Field,
    key: &str,
    plugin: &str,
) -> Result<(), MergeError> {
    // Sized for a few plugins' keys up front: growing the map is a large
    // part of a claim's cost.
    let m = f.compound.entry(field as i32).or_insert_with(|| {
        let mut m = api::CompoundFieldOwners::new();
        m.owners.reserve(16);
        m
    });
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

/// [`Owners::clear_simple`] on one container's records.
pub(crate) fn clear_simple(f: &mut api::FieldOwners, field: Field, plugin: &str) {
    f.simple.insert(field as i32, format!("-{plugin}"));
}

/// [`Owners::clear_compound`] on one container's records.
pub(crate) fn clear_compound(f: &mut api::FieldOwners, field: Field, key: &str, plugin: &str) {
    f.compound
        .entry(field as i32)
        .or_default()
        .owners
        .insert(key.to_string(), format!("-{plugin}"));
}

/// [`Owners::accumulate`] on one container's records.
pub(crate) fn accumulate(f: &mut api::FieldOwners, field: Field, plugin: &str) {
    let entry = f.simple.entry(field as i32).or_default();
    if !entry.is_empty() {
        entry.push(',');
    }
    entry.push_str(plugin);
}

#[cfg(test)]
mod tests {
    use super::*;

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
