//! Merging plugin responses, with ownership and conflict detection (NRI
//! `pkg/adaptation/result.go`).
//!
//! Plugins are applied one by one, in invocation order. Each accepted
//! adjustment is written back into the request, so later plugins see the
//! container as earlier plugins changed it. The first conflict aborts the
//! whole request: the caller gets the error and nothing partial.
//!
//! Conflict rules (upstream NRI's, as its adaptation applies them):
//! * every adjustable field (or key of a keyed field) has at most one owner;
//!   a second plugin setting it conflicts: `plugins "B" and "A" both tried
//!   to set <Field>[ <key>]`, newer plugin first;
//! * removing a key (`-key`, `-/mount/dest`, ...) clears its ownership to
//!   the remover, who alone may then set it, so "remove, then set" in one
//!   response is how a plugin takes over a key another plugin set;
//! * OCI hooks accumulate and never conflict; cgroup device rules are
//!   appended unchecked; namespaces are claimed even when removed.
//!
//! Deviations from upstream, each a fix of an upstream bug (tests pin them):
//! * removal of an environment variable or device that came from the
//!   runtime's original spec reaches the runtime as a `-NAME` / `-/dev/x`
//!   entry (upstream drops it, so the spec keeps the variable);
//! * the merged reply carries an `rdt` only when a plugin sent one;
//! * namespaces keep their order in the request later plugins see;
//! * an update with `ignore_failure` that fails leaves no claims and no
//!   entry behind;
//! * a pids limit in an update is applied (upstream tests the wrong value);
//! * the UpdateContainer target's entry is always present: the requested
//!   resources plus overrides (upstream appends nil when untouched);
//! * keys of maps are processed in sorted order, so which conflict is
//!   reported first is deterministic;
//! * a conflict on a simple field has no trailing space after the field.

use nri_proto::api::{self, Field};

pub use self::{create::CreateResult, update::UpdateResult};
use crate::result::owners::{FieldTable, Owners};

mod create;
pub(crate) mod owners;
mod update;

/// Conflicting or disallowed plugin adjustments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    /// Two plugins set the same field (or the same key of a keyed field).
    #[error("plugins {plugin:?} and {other:?} both tried to set {}", qualify(*.field, .key.as_deref()))]
    Conflict {
        /// The plugin whose claim failed.
        plugin: String,
        /// The plugin that owns (or cleared) the field.
        other: String,
        /// The field.
        field: Field,
        /// The key within the field (env name, mount destination, ...).
        key: Option<String>,
    },
    /// A plugin asked to update the container being created.
    #[error("plugin {plugin:?} asked update of {container:?} during creation")]
    UpdateDuringCreation {
        /// The plugin.
        plugin: String,
        /// The container being created.
        container: String,
    },
}

fn qualify(field: Field, key: Option<&str>) -> String {
    match key {
        Some(k) => format!("{field:?} {k}"),
        None => format!("{field:?}"),
    }
}

/// Whether the env entry `NAME=value` (or a bare `NAME`) is named `key`:
/// its text up to the first `=` equals `key`. Checks the byte after the
/// would-be name first, which rules out almost every other entry without
/// searching it for `=`.
fn env_has(entry: &str, key: &str) -> bool {
    let (e, k) = (entry.as_bytes(), key.as_bytes());
    let named = match e.len().cmp(&k.len()) {
        std::cmp::Ordering::Less => false,
        std::cmp::Ordering::Equal => e == k,
        std::cmp::Ordering::Greater => e[k.len()] == b'=' && e.starts_with(k),
    };
    // A name never holds `=`: an entry matched only up to a `=` in `key`
    // has a shorter name.
    named && !k.contains(&b'=')
}

/// Fills every absent part of a container with an empty value, as upstream
/// does before the first plugin sees it (plugins receive present-but-empty
/// `hooks`, `linux`, `linux.resources`, `.memory` and `.cpu`).
pub fn normalize_container(c: &mut api::Container) {
    c.hooks.mut_or_insert_default();
    let linux = c.linux.mut_or_insert_default();
    let res = linux.resources.mut_or_insert_default();
    res.memory.mut_or_insert_default();
    res.cpu.mut_or_insert_default();
}

fn empty_adjustment() -> api::ContainerAdjustment {
    let mut a = api::ContainerAdjustment::new();
    a.hooks.mut_or_insert_default();
    let res = a.linux.mut_or_insert_default().resources.mut_or_insert_default();
    res.memory.mut_or_insert_default();
    res.cpu.mut_or_insert_default();
    a
}

/// A finished CreateContainer merge, split for validation.
#[derive(Debug)]
pub(crate) struct Finished {
    /// The merged response.
    pub response: api::CreateContainerResponse,
    /// The container before any plugin changed it.
    pub pristine: api::Container,
    /// Who set what.
    pub owners: PendingOwners,
    /// The pod of the request.
    pub pod: api::PodSandbox,
    /// The container as the plugins left it (every accepted adjustment).
    pub container: api::Container,
}

/// Owners of a finished CreateContainer merge, not yet in protocol form.
#[derive(Debug)]
pub(crate) struct PendingOwners {
    id: String,
    created: FieldTable,
    others: Owners,
}

impl PendingOwners {
    /// The records as validators receive them.
    pub(crate) fn into_owners(self) -> Owners {
        with_created(self.others, &self.id, &self.created)
    }

    /// [`PendingOwners::into_owners`] of a copy.
    pub(crate) fn to_owners(&self) -> Owners {
        with_created(self.others.clone(), &self.id, &self.created)
    }
}

/// The owners of other containers plus those of the created container `id`.
fn with_created(mut others: Owners, id: &str, created: &FieldTable) -> Owners {
    others.set(id, created.to_proto());
    others
}

#[cfg(test)]
mod tests;
