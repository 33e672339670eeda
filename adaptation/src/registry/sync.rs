//! How plugins join: builtin and pre-installed plugins at start, external
//! ones as they connect. Each is registered and configured (see
//! [`crate::plugin`]), then enters the order of requests with its
//! Synchronize as its first turn (see [`crate::registry::turns`]), so it
//! sees the current state before any event. Every pod and container event
//! is either in the state a plugin is synchronized with or reaches the
//! plugin: the sync waits until every request admitted before it is
//! finished, the runtime's answer is completed with the adaptation's own
//! record of those requests (see [`crate::known`]), and requests admitted
//! after it reach the plugin once it answered its Synchronize. A runtime
//! needs no [`PluginSyncBlock`] for this.

use std::{
    sync::{Arc, Weak},
    time::Duration,
};

use async_trait::async_trait;
use futures::future::join_all;
use nri_proto::api;

use crate::{
    adaptation::Inner,
    error::{BoxError, Error, PluginError},
    observe::{Outcome, Rejection},
    permissions::{self, PermissionError},
    plugin::{HandshakeParams, Host, Joined, LaunchedIdentity, Plugin},
    registry::launch,
};

/// Why a plugin's Synchronize failed.
#[derive(Debug, thiserror::Error)]
enum SyncError {
    /// The request failed.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// Its updates are outside its permissions (failure policy `fail`).
    #[error(transparent)]
    Permission(#[from] PermissionError),
}

/// Synchronizes `p` with `pods` and `containers`; the updates it answered,
/// checked against its permissions: all of them, none when they are
/// outside and its failure policy is `ignore` (logged), an error under
/// `fail` (so the plugin does not join).
async fn synchronize(
    inner: &Inner,
    p: &Plugin,
    pods: &[api::PodSandbox],
    containers: &[api::Container],
) -> Result<Vec<api::ContainerUpdate>, SyncError> {
    let updates = p.synchronize(pods, containers).await?;
    let opts = inner.opts();
    let Some(e) = opts
        .permissions(p.name())
        .and_then(|perms| perms.check_updates(p.name(), &updates).err())
    else {
        return Ok(updates);
    };
    permissions::refuse(&inner.callbacks, p.policy, "Synchronize", e)?;
    Ok(Vec::new())
}

/// Held by a runtime around an operation that must not interleave with the
/// synchronization of a newly connected plugin (NRI `BlockPluginSync`).
pub struct PluginSyncBlock {
    pub(crate) _guard: tokio::sync::OwnedRwLockReadGuard<()>,
}

/// What a plugin connection may ask of the adaptation. Weak, so a plugin
/// does not keep a dropped adaptation alive.
struct HostRef(Weak<Inner>);

#[async_trait]
impl Host for HostRef {
    fn reserve(&self, idx: &str, base: &str) -> bool {
        self.0.upgrade().is_some_and(|i| i.registry.reserve(idx, base))
    }

    fn release(&self, idx: &str, base: &str) {
        if let Some(i) = self.0.upgrade() {
            i.registry.release(idx, base);
        }
    }

    fn observe(&self, plugin: &str, request: &'static str, elapsed: Duration, outcome: Outcome) {
        if let Some(i) = self.0.upgrade() {
            i.callbacks.observe(plugin, request, elapsed, outcome);
        }
    }

    async fn update_containers(
        &self,
        plugin: &str,
        update: Vec<api::ContainerUpdate>,
        evict: Vec<api::ContainerEviction>,
    ) -> Result<Vec<api::ContainerUpdate>, BoxError> {
        let inner = self.0.upgrade().ok_or("NRI adaptation is gone")?;
        // Checked whole before anything is applied: a refused call changes
        // nothing (there is no runtime request for a failure policy to fail).
        if let Some(perms) = inner.opts().permissions(plugin) {
            let checked = perms
                .check_evictions(plugin, &evict)
                .and_then(|()| perms.check_updates(plugin, &update));
            if let Err(e) = checked {
                inner.callbacks.rejected(plugin, Rejection::Permission);
                tracing::warn!(plugin, error = %e, "NRI plugin's UpdateContainers refused: outside its permissions");
                return Err(Box::new(e));
            }
        }
        // No adaptation lock here: a plugin may call this from inside an
        // event handler while the runtime waits for that event (NRI #301).
        inner.callbacks.update_containers(plugin, update, evict).await
    }
}

fn host(inner: &Arc<Inner>) -> Arc<dyn Host> {
    Arc::new(HostRef(Arc::downgrade(inner)))
}

fn params(inner: &Inner) -> HandshakeParams {
    HandshakeParams {
        runtime_name: inner.name.clone(),
        runtime_version: inner.version.clone(),
        registration_timeout: inner.opts().registration_timeout,
        request_timeout: inner.opts().request_timeout,
    }
}

/// Starts the builtin plugins, launches the pre-installed ones, syncs them
/// all with one call of the sync callback and adds those that synced.
///
/// A builtin that fails to configure or sync fails the start (as
/// upstream); a pre-installed plugin that fails is logged and left out. On
/// error no plugin is left running.
pub(crate) async fn start_plugins(inner: &Arc<Inner>) -> Result<(), Error> {
    let mut builtins = Vec::new();
    for b in &inner.builtins {
        let policy = inner.opts().failure_policy(&b.idx, &b.base);
        let started = Plugin::builtin(
            b.idx.clone(),
            b.base.clone(),
            b.events,
            b.plugin.clone(),
            &params(inner),
            host(inner),
            policy,
        )
        .await;
        match started {
            Ok(p) => builtins.push(p),
            Err(e) => {
                for p in &builtins {
                    p.close().await;
                }
                return Err(Error::Builtin {
                    plugin: format!("{}-{}", b.idx, b.base),
                    reason: e.to_string(),
                });
            }
        }
    }
    let n_builtins = builtins.len();
    let mut launched = builtins;
    let found = launch::discover(&inner.opts().plugin_path)?;
    launched.extend(launch_plugins(inner, found).await);
    if launched.is_empty() {
        return Ok(());
    }
    let ticket = inner.known.begin_sync();
    let state = match inner.callbacks.state().await {
        Ok(s) => s,
        Err(e) => {
            for p in &launched {
                p.shutdown(Duration::ZERO).await;
            }
            return Err(Error::SyncCallback(e));
        }
    };
    // As for an external plugin (see `join`): a runtime may send events
    // while the adaptation starts.
    let (barrier, turns) = inner.admission.barrier(|| {
        launched
            .iter()
            .map(|p| {
                let turn = p.turns.issue();
                inner.registry.enter(p.clone());
                turn
            })
            .collect::<Vec<_>>()
    });
    inner.admission.settled(barrier).await;
    let state = ticket.complete(state);
    let mut ready = Vec::new();
    let mut updates = Vec::new();
    for (i, (p, turn)) in launched.into_iter().zip(turns).enumerate() {
        match synchronize(inner, &p, &state.pods, &state.containers).await {
            Ok(u) => {
                updates.extend(u);
                ready.push((p, turn));
            }
            Err(e) if i < n_builtins => {
                for (p, _) in &ready {
                    inner.registry.fail(p);
                    p.shutdown(Duration::ZERO).await;
                }
                // Those not synchronized yet leave the order too.
                for q in inner.registry.lineup() {
                    if q.joined() == Joined::Syncing {
                        inner.registry.fail(&q);
                        q.shutdown(Duration::ZERO).await;
                    }
                }
                inner.registry.fail(&p);
                p.close().await;
                return Err(Error::Builtin {
                    plugin: p.name().to_string(),
                    reason: format!("synchronize failed: {e}"),
                });
            }
            Err(e) => {
                tracing::error!(plugin = %p.name(), error = %e, "failed to synchronize pre-installed NRI plugin, dropping it");
                inner.registry.fail(&p);
                drop(turn);
                p.close().await;
                p.kill().await;
            }
        }
    }
    for (p, turn) in ready {
        inner.registry.activate(p);
        drop(turn);
    }
    drop(ticket);
    inner.callbacks.apply_updates(updates).await;
    Ok(())
}

/// Launches the `found` plugins of the plugin directory and runs their
/// handshakes, all at once; those that fail are logged and left out.
pub(crate) async fn launch_plugins(inner: &Arc<Inner>, found: Vec<launch::Discovered>) -> Vec<Arc<Plugin>> {
    let params = params(inner);
    let tasks = found.into_iter().map(|d| {
        let params = params.clone();
        let host = host(inner);
        let inner = inner.clone();
        async move {
            let config = match launch::plugin_config(&inner.opts().plugin_config_path, &d.idx, &d.base) {
                Ok(c) => c,
                Err((file, e)) => {
                    tracing::error!(plugin = %format!("{}-{}", d.idx, d.base), file = %file.display(), error = %e, "cannot read NRI plugin configuration, not starting the plugin");
                    return None;
                }
            };
            #[cfg(feature = "wasm")]
            if d.wasm {
                return load_wasm(&inner, d, config, &params, host).await;
            }
            let (stream, child) = match launch::spawn(&d) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(path = %d.path.display(), error = %e, "failed to launch NRI plugin");
                    return None;
                }
            };
            let identity = LaunchedIdentity {
                idx: d.idx.clone(),
                base: d.base.clone(),
                config,
                path: d.path.clone(),
                child,
            };
            match Plugin::handshake(stream, Some(identity), &params, host, |i, b| inner.opts().failure_policy(i, b)).await {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!(path = %d.path.display(), error = %e, "NRI plugin failed to start");
                    None
                }
            }
        }
    });
    join_all(tasks).await.into_iter().flatten().collect()
}

/// Loads and configures the WebAssembly plugin `d` with the sandbox of the
/// options in effect; `None` (logged) when it fails.
#[cfg(feature = "wasm")]
async fn load_wasm(
    inner: &Arc<Inner>,
    d: launch::Discovered,
    config: String,
    params: &HandshakeParams,
    host: Arc<dyn Host>,
) -> Option<Arc<Plugin>> {
    let opts = inner.opts();
    let env = opts
        .wasm
        .grants(&d.idx, &d.base)
        .map(|g| g.env.iter().map(|(k, v)| format!("{k}={v}")).collect())
        .unwrap_or_default();
    let w = crate::plugin::WasmPlugin {
        memory_limit: opts.wasm.memory_limit(&d.idx, &d.base),
        env,
        config,
        path: d.path.clone(),
        idx: d.idx.clone(),
        base: d.base.clone(),
    };
    let policy = opts.failure_policy(&d.idx, &d.base);
    match Plugin::wasm(w, params, host, policy).await {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!(path = %d.path.display(), error = %e, "WebAssembly NRI plugin failed to start");
            None
        }
    }
}

/// Registers, configures and synchronizes a plugin that dialled the socket.
pub(crate) async fn connect_external(inner: Arc<Inner>, stream: tokio::net::UnixStream) {
    let params = params(&inner);
    let plugin = match Plugin::handshake(stream, None, &params, host(&inner), |i, b| {
        inner.opts().failure_policy(i, b)
    })
    .await
    {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "external NRI plugin failed to connect");
            return;
        }
    };
    join(&inner, plugin).await;
}

/// Synchronizes a plugin that joins a running adaptation (not holding off
/// runtime operations under a [`PluginSyncBlock`]) and adds it; `false`
/// when it failed and was closed.
pub(crate) async fn join(inner: &Arc<Inner>, plugin: Arc<Plugin>) -> bool {
    let _sync = inner.sync_lock.write().await;
    // Begun before asking the runtime, so what changes while it answers is
    // known to be newer than its answer.
    let ticket = inner.known.begin_sync();
    let state = match inner.callbacks.state().await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(plugin = %plugin.name(), error = &*e as &dyn std::error::Error, "runtime failed to list pods and containers, closing NRI plugin");
            plugin.close().await;
            plugin.kill().await;
            return false;
        }
    };
    // Into the order of requests, its Synchronize first: requests admitted
    // from now on reach it after the sync; those admitted before are in
    // the record the state is completed with once they are finished. Not
    // around the runtime's callbacks, which may take locks the runtime
    // holds while calling an event method.
    let (barrier, turn) = inner.admission.barrier(|| {
        let turn = plugin.turns.issue();
        inner.registry.enter(plugin.clone());
        turn
    });
    inner.admission.settled(barrier).await;
    let state = ticket.complete(state);
    let updates = match synchronize(inner, &plugin, &state.pods, &state.containers).await {
        Ok(updates) if inner.is_running() && !plugin.is_closed() => {
            inner.registry.activate(plugin);
            updates
        }
        Ok(_) => {
            inner.registry.fail(&plugin);
            plugin.close().await;
            plugin.kill().await;
            return false;
        }
        Err(e) => {
            tracing::error!(plugin = %plugin.name(), error = %e, "failed to synchronize NRI plugin, closing it");
            inner.registry.fail(&plugin);
            plugin.close().await;
            plugin.kill().await;
            return false;
        }
    };
    drop(turn);
    drop(ticket);
    inner.callbacks.apply_updates(updates).await;
    true
}
