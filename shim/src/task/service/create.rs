//! Task.Create: NRI adjusts the spec, the runner creates the container.
//!
//! Order (NRI's, as containerd's CRI plugin drives it): RunPodSandbox the
//! first time a pod is seen, CreateContainer (the merged adjustment is
//! applied to the spec and `config.json` rewritten), updates of other
//! containers, the runner's create, the `/tasks/create` event, then
//! PostCreateContainer. A failure at any step undoes the steps before it.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, atomic::AtomicBool},
};

use containerd_shim_protos::{api as task_api, events::task as ev};
use nri_adaptation::{api, convert, spec};
use protobuf::MessageField;

use super::{
    Service,
    process::{Proc, Task},
};
use crate::{
    container::bundle::{self, Bundle},
    container::idmap,
    container::runner::CreateRequest,
    error::Result,
    nri::{self, Identity, Role},
    stdio::{ProcessIo, StdioSpec},
    sync::lock,
    task::audit::AuditRecord,
    task::events::topics,
    waits,
};

/// Undo actions for a create that fails half-way.
#[derive(Default)]
struct Undo {
    nri_container: Option<(api::PodSandbox, api::Container)>,
    nri_pod: Option<api::PodSandbox>,
    config: Option<Vec<u8>>,
    mounts: Vec<PathBuf>,
    /// The runner was asked to create the container, in this cgroup.
    runner_created: Option<PathBuf>,
}

/// Gives a spec without `linux.cgroupsPath` the shim's default
/// ([`crate::cgroups::default_path`]), before NRI, so plugins see the path
/// the container gets. Returns whether it set one.
fn default_cgroups_path(spec: &mut oci_spec::runtime::Spec, ns: &str, id: &str, systemd: bool) -> bool {
    let Some(linux) = spec.linux_mut().as_mut() else {
        return false;
    };
    if linux.cgroups_path().is_some() {
        return false;
    }
    linux.set_cgroups_path(Some(crate::cgroups::default_path(ns, id, systemd)));
    true
}

/// A relative `linux.cgroupsPath` under the cgroupfs driver becomes the
/// absolute path runc would give it (see
/// [`crate::cgroups::path::cgroupfs_relative`]); for systemd's
/// `slice:prefix:name` form, the pod's sandbox logs one warning naming the
/// likely driver mismatch. Returns whether the spec changed.
fn relocate_relative_cgroups_path(
    spec: &mut oci_spec::runtime::Spec,
    systemd: bool,
    role: Role,
    id: &str,
    pod: &str,
) -> bool {
    let Some(linux) = spec.linux_mut().as_mut() else {
        return false;
    };
    let Some(path) = linux.cgroups_path().clone() else {
        return false;
    };
    let own = crate::cgroups::path::own_cgroup();
    let Some(absolute) = crate::cgroups::path::cgroupfs_relative(&path, systemd, &own) else {
        return false;
    };
    if crate::cgroups::SystemdPath::parse(&path).is_some() && role != Role::Container {
        tracing::warn!(
            task = id,
            pod,
            cgroups_path = %path.display(),
            cgroup = %absolute.display(),
            "linux.cgroupsPath is systemd's slice:prefix:name form but the runtime options do not set \
             SystemdCgroup = true: kubelet and containerd likely disagree on the cgroup driver (or a CRI client \
             assumed systemd); as runc's cgroupfs driver does, the pod runs in a cgroup of that literal name"
        );
    }
    linux.set_cgroups_path(Some(absolute));
    true
}

impl Service {
    /// Creates a task: NRI adjusts the spec, the runner creates the
    /// container. On any failure nothing is left behind (no container
    /// state, cgroup, mount or socket; the id can be used again at once).
    ///
    /// # Errors
    /// [`crate::error::ShimError::AlreadyExists`], [`crate::error::ShimError::Nri`] when plugins refuse
    /// the container, [`crate::error::ShimError::InvalidArgument`] for a bad spec or
    /// stdio, [`crate::error::ShimError::Runtime`] when the runner fails.
    pub async fn create(&self, ns: &str, req: task_api::CreateTaskRequest) -> Result<task_api::CreateTaskResponse> {
        let reservation = self.inner.tasks.reserve(ns, &req.id)?;
        // The container's cgroup migration comes in a few ms: its grace
        // period starts now (see crate::cgroups::prime).
        crate::cgroups::prime::prime();
        let log_key = format!("{ns}/{}", req.id);
        // The Create `start` was run for has come (see crate::node::claim),
        // and the task's log fifo is attached: an unlink and an open in
        // directories that may be on a disk, where the kernel can make them
        // wait for the journal, so never on the runtime thread.
        let (state_root, ns_, id, key, bundle) = (
            self.inner.state_root.clone(),
            ns.to_string(),
            req.id.clone(),
            log_key.clone(),
            PathBuf::from(&req.bundle),
        );
        waits::blocking("claim and log fifo", move || {
            crate::node::claim::consume(&state_root, &ns_, &id);
            crate::node::shimlog::SHIM_LOG.attach(&key, &bundle);
        })
        .await;
        let mut undo = Undo::default();
        match self.create_inner(ns, &req, &mut undo).await {
            Ok(task) => {
                reservation.insert(task.clone());
                self.announce_created(&task, &req).await;
                let pid = task.init.pid();
                tracing::info!(task = %req.id, namespace = ns, pid, "task created");
                Ok(task_api::CreateTaskResponse {
                    pid,
                    ..Default::default()
                })
            }
            Err(e) => {
                tracing::warn!(task = %req.id, namespace = ns, error = %crate::error::chain(&e), "create failed, cleaning up");
                self.undo_create(ns, &req, undo).await;
                drop(reservation);
                crate::node::shimlog::SHIM_LOG.detach(&log_key);
                Err(e)
            }
        }
    }

    async fn create_inner(&self, ns: &str, req: &task_api::CreateTaskRequest, undo: &mut Undo) -> Result<Arc<Task>> {
        let id = req.id.as_str();
        let options = crate::cgroups::options::RuntimeOptions::parse(req.options.as_ref())?;
        let bundle = Bundle::new(&req.bundle);
        let loaded = {
            let b = bundle.clone();
            waits::blocking("read config.json", move || b.load_spec()).await?
        };
        let mut spec = loaded.spec;
        tracing::debug!(task = id, root = ?spec.root(), args = ?spec.process().as_ref().and_then(|p| p.args().clone()), "creating");
        let defaulted_path = bundle::default_path_env(&mut spec);
        let defaulted_cgroup = default_cgroups_path(&mut spec, ns, id, options.systemd_cgroup);
        let Identity { role, pod, name } = nri::identify(ns, id, &spec);
        let cdi = self.cdi();
        // CDI requests of the spec's annotations, before NRI (plugins see
        // the devices, as with containerd's own CDI injection). A sandbox
        // gets no devices: its annotations are the pod's.
        let mut cdi_injected = false;
        if role != Role::Sandbox {
            let requested = crate::cdi::annotation_devices(spec.annotations().as_ref())?;
            if !requested.is_empty() {
                let (registry, mut s) = (cdi.clone(), spec);
                let (s, injected) = waits::blocking("CDI spec files", move || {
                    let r = registry.inject(&mut s, &requested).map(|()| requested);
                    (s, r)
                })
                .await;
                spec = s;
                let injected = injected?;
                tracing::info!(task = id, devices = ?injected, "CDI devices injected (annotations)");
                cdi_injected = true;
            }
        }
        undo.mounts = {
            let (mounts, target) = (req.rootfs.clone(), bundle.rootfs());
            waits::blocking("mount rootfs", move || bundle::mount_rootfs(&mounts, &target)).await?
        };
        let nri = self.nri();
        let (pod, announced) = self.ensure_pod(&nri, role, pod).await?;
        if announced {
            undo.nri_pod = Some(pod.clone());
        }
        let mut container = convert::container_from_spec(id, &pod.id, &name, &spec);
        if let Some(image) = spec.annotations().as_ref().and_then(|a| a.get(nri::IMAGE_NAME)) {
            container.image.mut_or_insert_default().name = image.clone();
        }
        let mut updates = Vec::new();
        let mut audit = None;
        if role != Role::Sandbox {
            // Undone even when a plugin refuses: plugins called before it
            // may hold resources for this container.
            undo.nri_container = Some((pod.clone(), container.clone()));
            let created = waits::timed(
                "NRI CreateContainer",
                nri.create_container(api::CreateContainerRequest {
                    pod: MessageField::some(pod.clone()),
                    container: MessageField::some(container.clone()),
                    ..Default::default()
                }),
            )
            .await?;
            audit = Some(AuditRecord::new(ns, id, &pod.id, &created.report, &created.response));
            let mut rsp = created.response;
            let adjust = rsp.adjust.take().unwrap_or_default();
            // Off the runtime thread: bind sources are checked on disk, CDI
            // devices a plugin asks for are read from their spec files.
            let (registry, mut s) = (cdi.clone(), spec);
            let (s, adjusted) = waits::blocking("apply NRI adjustments", move || {
                let r = bundle::check_nri_mounts(&adjust).and_then(|()| {
                    spec::Adjuster::new()
                        .with_cdi_injector(|s, names| registry.inject(s, names).map_err(|e| e.to_string()))
                        .adjust(&mut s, &adjust)
                        .map_err(Into::into)
                });
                (s, r)
            })
            .await;
            spec = s;
            adjusted?;
            updates = rsp.update;
        }
        let relocated = relocate_relative_cgroups_path(&mut spec, options.systemd_cgroup, role, id, &pod.name);
        idmap::check_process_ids_mapped(&spec)?;
        // Idmapped bind mounts (a user-namespaced pod's volumes) are made
        // here, since libcontainer refuses them; plugins keep seeing the
        // volumes' own sources, not where they were staged.
        let unstaged = idmap::wants_staging(&spec).then(|| spec.clone());
        if unstaged.is_some() {
            let (dir, mut s) = (bundle.dir().to_path_buf(), spec);
            let (s, staged) = waits::blocking("idmapped mounts", move || {
                let r = idmap::stage_spec_mounts(&mut s, &dir);
                (s, r)
            })
            .await;
            spec = s;
            undo.mounts.extend(staged?);
        }
        if role != Role::Sandbox
            || defaulted_path
            || defaulted_cgroup
            || cdi_injected
            || relocated
            || unstaged.is_some()
        {
            let (b, s) = (bundle.clone(), spec.clone());
            waits::blocking("write config.json", move || b.write_spec(&s)).await?;
            undo.config = Some(loaded.original);
        }
        if role != Role::Sandbox {
            container = convert::container_from_spec(id, &pod.id, &name, unstaged.as_ref().unwrap_or(&spec));
            if !updates.is_empty() {
                let failed = self.apply_updates(updates).await;
                if !failed.is_empty() {
                    tracing::warn!(task = id, failed = failed.len(), "some NRI container updates failed");
                }
            }
        }
        crate::cgroups::check_unified(spec.linux().as_ref().and_then(|l| l.resources().as_ref()))?;
        let spec_cgroups_path = spec.linux().as_ref().and_then(|l| l.cgroups_path().clone());
        crate::cgroups::check_driver(spec_cgroups_path.as_deref(), options.systemd_cgroup)?;
        // Set above (a plugin can change the path, not remove it).
        let cgroups_path =
            spec_cgroups_path.unwrap_or_else(|| crate::cgroups::default_path(ns, id, options.systemd_cgroup));
        let stdio = StdioSpec {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
        };
        let mut io = ProcessIo::prepare(&stdio, &self.console_path(ns, id))?;
        if !options.systemd_cgroup && crate::cgroups::path::unified_host() {
            // runc's cgroupfs driver on v2 (see crate::cgroups::threaded);
            // removed with the container if the create fails below.
            let (path, resources) = (
                cgroups_path.clone(),
                spec.linux().as_ref().and_then(|l| l.resources().clone()),
            );
            waits::blocking("make the cgroup", move || {
                crate::cgroups::threaded::prepare(
                    std::path::Path::new(crate::cgroups::CGROUP_ROOT),
                    &path,
                    resources.as_ref(),
                )
            })
            .await?;
        }
        undo.runner_created = Some(cgroups_path.clone());
        let fds = io.take_fds()?;
        let process = waits::timed(
            "libcontainer create",
            self.runner().create(
                CreateRequest {
                    id,
                    bundle: bundle.dir(),
                    console_socket: io.console_socket.as_deref(),
                    systemd_cgroup: options.systemd_cgroup,
                },
                fds,
            ),
        )
        .await?;
        if io.console_socket.is_some() {
            // Accepting the console connection waits for libcontainer.
            io = waits::blocking("receive the terminal", move || io.attach_console().map(|()| io)).await?;
        }
        container.pid = process.pid() as u32;
        let init = Proc::new("", stdio, None);
        *lock(&init.process) = Some(process);
        *lock(&init.io) = Some(io);
        let own_pid_namespace = bundle::has_own_pid_namespace(&spec);
        let env = spec
            .process()
            .as_ref()
            .and_then(|p| p.env().clone())
            .unwrap_or_default();
        let (b, state_root) = (bundle.clone(), self.inner.state_root.clone());
        waits::blocking("write records", move || {
            b.clear_exit_status();
            if let Some(audit) = audit {
                keep_audit(&state_root, &audit);
            }
        })
        .await;
        let rootfs_mounts = std::mem::take(&mut undo.mounts);
        *undo = Undo::default();
        Ok(Arc::new(Task {
            ns: ns.to_string(),
            id: id.to_string(),
            bundle: bundle.dir().to_path_buf(),
            role,
            pod_id: pod.id.clone(),
            cgroups_path,
            container: Mutex::new(container),
            init,
            execs: Mutex::new(HashMap::new()),
            stopped_nri: tokio::sync::Mutex::new(false),
            sigkilled: AtomicBool::new(false),
            rootfs_mounts,
            own_pid_namespace,
            oom_published: tokio::sync::Mutex::new(0),
            env,
        }))
    }

    /// After the task is in the table: the exit watcher, the create event,
    /// then PostCreateContainer.
    async fn announce_created(&self, task: &Arc<Task>, req: &task_api::CreateTaskRequest) {
        tokio::spawn(self.clone().watch_exit(task.clone(), task.init.clone()));
        if let Some(oom) = self.runner().watch_oom(task.target()) {
            tokio::spawn(self.clone().watch_oom(task.clone(), oom));
        }
        let mut ev = ev::TaskCreate {
            container_id: task.id.clone(),
            bundle: req.bundle.clone(),
            rootfs: req.rootfs.clone(),
            pid: task.init.pid(),
            ..Default::default()
        };
        let io_ev = ev.io.mut_or_insert_default();
        io_ev.stdin = req.stdin.clone();
        io_ev.stdout = req.stdout.clone();
        io_ev.stderr = req.stderr.clone();
        io_ev.terminal = req.terminal;
        self.publish(&task.ns, topics::CREATE, Box::new(ev));
        if task.role != Role::Sandbox {
            let pod = self.pod(&task.pod_id);
            if let Err(e) = self.nri().post_create_container(&pod, &task.nri_container()).await {
                tracing::warn!(task = %task.id, error = %crate::error::chain(&e), "NRI PostCreateContainer failed");
            }
        }
    }
}

/// Keeps a created container's audit record and logs, at info, the
/// plugins that changed it. A record that cannot be written does not
/// fail the create (the container is adjusted and runs): it is logged.
fn keep_audit(state_root: &std::path::Path, audit: &AuditRecord) {
    {
        let changed_by = audit.changed_by();
        tracing::info!(
            task = %audit.id,
            namespace = %audit.namespace,
            changed_by = ?changed_by,
            fields = audit.changes.len(),
            called = audit.plugins.len(),
            "NRI adjustments applied"
        );
        if let Err(e) = audit.write(state_root) {
            tracing::warn!(task = %audit.id, error = %crate::error::chain(&e), "NRI audit record not kept");
        }
    }
}

impl Service {
    /// The console socket of a task's init.
    fn console_path(&self, ns: &str, id: &str) -> PathBuf {
        crate::layout::init_console(&self.inner.state_root, ns, id)
    }

    async fn undo_create(&self, ns: &str, req: &task_api::CreateTaskRequest, undo: Undo) {
        let nri = self.nri();
        if let Some(cgroups_path) = &undo.runner_created {
            // With the cgroup: a create that failed in libcontainer may have
            // left it (see helper's delete).
            if let Err(e) = self.runner().delete(&req.id, Some(cgroups_path)).await {
                // The create's own error is what the caller gets; this one
                // says what may be left behind.
                tracing::warn!(task = %req.id, cgroup = %cgroups_path.display(), error = %crate::error::chain(&e),
                    "cleaning up after a failed create failed");
            }
        }
        // As containerd does for a failed create: tell plugins it is gone.
        if let Some((pod, c)) = &undo.nri_container {
            let _ = nri
                .stop_container(api::StopContainerRequest {
                    pod: MessageField::some(pod.clone()),
                    container: MessageField::some(c.clone()),
                    ..Default::default()
                })
                .await;
            let _ = nri.remove_container(pod, c).await;
        }
        if let Some(pod) = &undo.nri_pod {
            self.forget_pod(&nri, pod).await;
        }
        let (dir, console, mounts) = (req.bundle.clone(), self.console_path(ns, &req.id), undo.mounts);
        let detached = waits::blocking("undo the create's files and mounts", move || {
            if let Some(original) = undo.config {
                Bundle::new(&dir).restore_spec(&original);
            }
            let _ = std::fs::remove_file(console);
            let detached = bundle::detach_all(&mounts);
            idmap::unstage_all(Path::new(&dir));
            detached
        })
        .await;
        // The filesystem's release syncs it: nobody waits for that.
        tokio::task::spawn_blocking(move || drop(detached));
    }
}
