//! The plugin table: plugins in invocation order (index, then name), those
//! synchronizing and the active ones, the `IDX-NAME`s taken by registered
//! or registering plugins, and removal of a plugin whose connection went
//! away. Around it: how plugins join ([`launch`] of pre-installed ones, the
//! [`socket`] external ones dial, [`sync`] on joining), the order in which
//! they get requests ([`turns`]) and how one runtime request reaches them
//! ([`dispatch`]). May use `plugin`, `result`, `validate`, `known` and the
//! crate's API types; the [`crate::Adaptation`] drives it.

pub(crate) mod dispatch;
pub(crate) mod launch;
pub(crate) mod socket;
pub(crate) mod sync;
pub(crate) mod turns;

use std::{
    collections::HashSet,
    sync::{Arc, Mutex, RwLock},
};

use nri_proto::sync::{lock, read, write};

use crate::plugin::{Joined, Plugin, PluginOrigin};

/// Plugins in the order of requests, and reserved names.
#[derive(Default)]
pub(crate) struct Registry {
    /// Sorted by (index, name): the active plugins and those whose
    /// Synchronize is under way ([`Joined::Syncing`]).
    plugins: RwLock<Vec<Arc<Plugin>>>,
    /// `IDX-NAME` of every registered (or registering) plugin.
    reserved: Mutex<HashSet<String>>,
}

impl Registry {
    /// The active plugins in invocation order.
    pub fn snapshot(&self) -> Vec<Arc<Plugin>> {
        read(&self.plugins)
            .iter()
            .filter(|p| p.joined() == Joined::Active)
            .cloned()
            .collect()
    }

    /// The plugins a request admitted now may call, in invocation order:
    /// the active ones and those synchronizing (a request waits behind
    /// their Synchronize). A request works on this copy, so plugins
    /// joining or leaving meanwhile do not disturb it.
    pub fn lineup(&self) -> Vec<Arc<Plugin>> {
        read(&self.plugins).clone()
    }

    /// `IDX-NAME` of the active plugins, in invocation order.
    pub fn names(&self) -> Vec<String> {
        self.snapshot().iter().map(|p| p.name().to_string()).collect()
    }

    /// Whether a plugin that dialled the socket is active.
    pub fn has_external(&self) -> bool {
        self.snapshot()
            .iter()
            .any(|p| matches!(p.origin, PluginOrigin::External { .. }))
    }

    /// Takes `IDX-NAME` for a registering plugin; false if a live or
    /// registering plugin already holds it (upstream lets a second one in).
    pub fn reserve(&self, idx: &str, base: &str) -> bool {
        self.reserved().insert(format!("{idx}-{base}"))
    }

    /// Frees a name taken by [`Registry::reserve`].
    pub fn release(&self, idx: &str, base: &str) {
        self.reserved().remove(&format!("{idx}-{base}"));
    }

    fn reserved(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        lock(&self.reserved)
    }

    /// Puts a plugin about to synchronize into the order (under the
    /// admission lock: requests admitted from now on include it).
    pub fn enter(&self, p: Arc<Plugin>) {
        let mut list = write(&self.plugins);
        list.push(p);
        // Stable order: index, then name (upstream leaves ties unordered).
        list.sort_by(|a, b| (a.idx.as_str(), a.base.as_str()).cmp(&(b.idx.as_str(), b.base.as_str())));
    }

    /// Marks an entered plugin synchronized, and removes it again as soon
    /// as its connection goes away.
    pub fn activate(self: &Arc<Self>, p: Arc<Plugin>) {
        p.set_joined(Joined::Active);
        tracing::info!(plugin = %p.name(), origin = %p.origin, "NRI plugin active");
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            p.closed().await;
            if let Some(registry) = weak.upgrade() {
                // A plugin already taken out of the table is being shut down
                // by whoever took it (reload, stop): killing it here would
                // cut short the exit it was given after Shutdown.
                if registry.take(&p) {
                    tracing::info!(plugin = %p.name(), "NRI plugin removed");
                    p.close().await;
                    p.kill().await;
                }
            }
        });
    }

    /// Takes out an entered plugin whose sync failed; requests that were
    /// admitted with it pass it by.
    pub fn fail(&self, p: &Arc<Plugin>) {
        p.set_joined(Joined::Failed);
        self.take(p);
    }

    /// Takes `p` out of the table; whether it was there. Its name is
    /// given back at once, under the table's lock: a plugin that failed,
    /// was removed or lost its connection, once no longer listed (see
    /// [`Registry::names`]), never keeps a new plugin of its name from
    /// registering, as it did until its close ran.
    fn take(&self, p: &Arc<Plugin>) -> bool {
        let mut list = write(&self.plugins);
        let taken = Self::unlist(&mut list, p);
        if taken {
            p.release_name();
        }
        taken
    }

    /// Drops `p` from `list`; whether it was there.
    fn unlist(list: &mut Vec<Arc<Plugin>>, p: &Arc<Plugin>) -> bool {
        let before = list.len();
        list.retain(|q| !Arc::ptr_eq(q, p));
        before != list.len()
    }

    /// Deactivates `p`, closes it and kills its process (if launched).
    pub async fn remove(&self, p: &Arc<Plugin>) {
        if self.take(p) {
            tracing::info!(plugin = %p.name(), "NRI plugin removed");
        }
        p.close().await;
        p.kill().await;
    }

    /// Deactivates `p`, asks it to shut down (bounded by `wait`) and
    /// kills its process (if launched). Its name stays taken until that
    /// shutdown closes it: no second plugin of the name while it runs.
    pub async fn remove_gracefully(&self, p: &Arc<Plugin>, wait: std::time::Duration) {
        Self::unlist(&mut write(&self.plugins), p);
        tracing::info!(plugin = %p.name(), "NRI plugin removed");
        p.shutdown(wait).await;
    }

    /// Empties the table (at stop); the caller shuts the plugins down.
    pub fn take_all(&self) -> Vec<Arc<Plugin>> {
        std::mem::take(&mut *write(&self.plugins))
    }
}
