//! The merge of CreateContainer responses: the adjustment, field by field
//! with ownership, and the updates of other containers.

use std::collections::HashMap;

use nri_proto::api::{self, Field};
use protobuf::MessageField;

use super::{
    Finished, MergeError, PendingOwners, empty_adjustment, env_has, normalize_container, update::Updates, with_created,
};
use crate::{
    resources::{self, Keyed, Rules, removal_key},
    result::owners::{FieldTable, Owners, Records},
    spec::canonical_rlimit_type,
};

/// Accumulates the CreateContainer responses of all plugins.
#[derive(Debug, Clone)]
pub struct CreateResult {
    request: api::CreateContainerRequest,
    pristine: api::Container,
    reply: api::ContainerAdjustment,
    updates: Updates,
    /// Owners of the created container's fields (kept apart from `owners`
    /// so the hot path does not hash the container id for every claim).
    own: FieldTable,
    /// Owners of other containers' fields (updates).
    owners: Owners,
}

impl CreateResult {
    /// Starts from the runtime's request (normalized, see
    /// [`normalize_container`]).
    pub fn new(request: api::CreateContainerRequest) -> Self {
        Self::with_pristine(request, true)
    }

    /// [`CreateResult::new`]; keeps a copy of the pristine container only
    /// when `keep_pristine` (validators need it, nothing else does).
    pub fn with_pristine(mut request: api::CreateContainerRequest, keep_pristine: bool) -> Self {
        normalize_container(request.container.mut_or_insert_default());
        request.pod.mut_or_insert_default();
        let pristine = if keep_pristine {
            request.container.get_or_default().clone()
        } else {
            api::Container::new()
        };
        CreateResult {
            request,
            pristine,
            reply: empty_adjustment(),
            updates: Updates::default(),
            own: FieldTable::default(),
            owners: Owners::new(),
        }
    }

    /// The request as the next plugin sees it: the container with every
    /// adjustment accepted so far.
    pub fn request(&self) -> &api::CreateContainerRequest {
        &self.request
    }

    /// The container before any plugin changed it (what validators get;
    /// empty when created without it).
    pub fn pristine(&self) -> &api::Container {
        &self.pristine
    }

    /// Ownership records so far (a copy).
    pub fn owners(&self) -> Owners {
        with_created(self.owners.clone(), &self.request.container.id, &self.own)
    }

    /// The merged adjustment so far.
    pub fn adjustment(&self) -> &api::ContainerAdjustment {
        &self.reply
    }

    /// The merged updates of other containers so far.
    pub fn updates(&self) -> &[api::ContainerUpdate] {
        &self.updates.list
    }

    /// Merges one plugin's response. On error this result must be dropped
    /// (the runtime request fails as a whole).
    ///
    /// # Errors
    /// [`MergeError::Conflict`], [`MergeError::UpdateDuringCreation`].
    pub fn apply(&mut self, plugin: &str, rsp: api::CreateContainerResponse) -> Result<(), MergeError> {
        if let Some(adj) = rsp.adjust.into_option() {
            self.adjust(plugin, adj)?;
        }
        if let Some(u) = rsp.update.iter().find(|u| u.container_id == self.request.container.id) {
            return Err(MergeError::UpdateDuringCreation {
                plugin: plugin.to_string(),
                container: u.container_id.clone(),
            });
        }
        self.updates.merge(&mut self.owners, plugin, rsp.update, None)
    }

    /// The merged response: the adjustment and the updates of other containers.
    pub fn into_response(self) -> api::CreateContainerResponse {
        api::CreateContainerResponse {
            adjust: MessageField::some(self.reply),
            update: self.updates.list,
            ..Default::default()
        }
    }

    /// Splits into (response, pristine container, owners).
    pub fn into_parts(self) -> (api::CreateContainerResponse, api::Container, Owners) {
        let f = self.finish();
        (f.response, f.pristine, f.owners.into_owners())
    }

    /// [`CreateResult::into_parts`] with the pod, and the owners still in merge form:
    /// building the protocol message costs as much as a plugin's merge,
    /// and only validators and reports need it.
    pub(crate) fn finish(mut self) -> Finished {
        let container = self.request.container.take().unwrap_or_default();
        Finished {
            response: api::CreateContainerResponse {
                adjust: MessageField::some(self.reply),
                update: self.updates.list,
                ..Default::default()
            },
            pristine: self.pristine,
            owners: PendingOwners {
                id: container.id.clone(),
                created: self.own,
                others: self.owners,
            },
            pod: self.request.pod.take().unwrap_or_default(),
            container,
        }
    }

    fn adjust(&mut self, plugin: &str, a: api::ContainerAdjustment) -> Result<(), MergeError> {
        self.annotations(plugin, a.annotations)?;
        self.mounts(plugin, a.mounts)?;
        self.env(plugin, a.env)?;
        self.args(plugin, a.args)?;
        if let Some(h) = a.hooks.into_option() {
            self.hooks(plugin, h);
        }
        if let Some(l) = a.linux.into_option() {
            self.devices(plugin, l.devices)?;
            if let Some(r) = l.resources.into_option() {
                self.resources(plugin, r)?;
            }
            self.linux_simple(plugin, l.cgroups_path, l.oom_score_adj, l.io_priority, l.seccomp_policy)?;
            self.namespaces(plugin, l.namespaces)?;
            self.sysctl(plugin, l.sysctl)?;
            self.net_devices(plugin, l.net_devices)?;
            if let Some(s) = l.scheduler.into_option() {
                self.own.claim_simple(Field::LinuxSched, plugin)?;
                self.ctr_linux().scheduler = MessageField::some(s.clone());
                self.reply.linux.mut_or_insert_default().scheduler = MessageField::some(s);
            }
            if let Some(rdt) = l.rdt.into_option() {
                self.rdt(plugin, rdt)?;
            }
            if let Some(mp) = l.memory_policy.into_option() {
                self.own.claim_simple(Field::MemoryPolicy, plugin)?;
                self.reply.linux.mut_or_insert_default().memory_policy = MessageField::some(mp);
            }
        }
        for rl in a.rlimits {
            // `nofile` and `RLIMIT_NOFILE` are one limit (see adjust).
            self.own
                .claim_compound(Field::Rlimits, &canonical_rlimit_type(&rl.type_), plugin)?;
            self.request.container.mut_or_insert_default().rlimits.push(rl.clone());
            self.reply.rlimits.push(rl);
        }
        for d in a.CDI_devices {
            self.own.claim_compound(Field::CdiDevices, &d.name, plugin)?;
            self.reply.CDI_devices.push(d);
        }
        Ok(())
    }

    /// Annotations, sysctl and net devices: maps with `-key` removals.
    fn annotations(&mut self, plugin: &str, m: HashMap<String, String>) -> Result<(), MergeError> {
        let ctr = &mut self.request.container.mut_or_insert_default().annotations;
        resources::merge_map(
            &mut self.own,
            Field::Annotations,
            plugin,
            m,
            ctr,
            &mut self.reply.annotations,
        )
    }

    fn sysctl(&mut self, plugin: &str, m: HashMap<String, String>) -> Result<(), MergeError> {
        let ctr = &mut self
            .request
            .container
            .mut_or_insert_default()
            .linux
            .mut_or_insert_default()
            .sysctl;
        let reply = &mut self.reply.linux.mut_or_insert_default().sysctl;
        resources::merge_map(&mut self.own, Field::Sysctl, plugin, m, ctr, reply)
    }

    fn net_devices(&mut self, plugin: &str, m: HashMap<String, api::LinuxNetDevice>) -> Result<(), MergeError> {
        let ctr = &mut self
            .request
            .container
            .mut_or_insert_default()
            .linux
            .mut_or_insert_default()
            .net_devices;
        let reply = &mut self.reply.linux.mut_or_insert_default().net_devices;
        resources::merge_map(&mut self.own, Field::LinuxNetDevices, plugin, m, ctr, reply)
    }

    fn ctr_linux(&mut self) -> &mut api::LinuxContainer {
        self.request
            .container
            .mut_or_insert_default()
            .linux
            .mut_or_insert_default()
    }

    fn reply_linux(&mut self) -> &mut api::LinuxContainerAdjustment {
        self.reply.linux.mut_or_insert_default()
    }

    /// Mounts (by destination), devices (by path) and env (by name): keyed
    /// lists with `-key` removals.
    fn mounts(&mut self, plugin: &str, mounts: Vec<api::Mount>) -> Result<(), MergeError> {
        const MOUNTS: Keyed<api::Mount, api::Mount> = Keyed {
            field: Field::Mounts,
            key: |m| &m.destination,
            ctr_has: |m, key| m.destination == key,
            to_ctr: Clone::clone,
        };
        let ctr = &mut self.request.container.mut_or_insert_default().mounts;
        resources::merge_keyed(&mut self.own, &MOUNTS, plugin, mounts, &mut self.reply.mounts, ctr)
    }

    fn devices(&mut self, plugin: &str, devices: Vec<api::LinuxDevice>) -> Result<(), MergeError> {
        const DEVICES: Keyed<api::LinuxDevice, api::LinuxDevice> = Keyed {
            field: Field::Devices,
            key: |d| &d.path,
            ctr_has: |d, key| d.path == key,
            to_ctr: Clone::clone,
        };
        let ctr = &mut self
            .request
            .container
            .mut_or_insert_default()
            .linux
            .mut_or_insert_default()
            .devices;
        let reply = &mut self.reply.linux.mut_or_insert_default().devices;
        resources::merge_keyed(&mut self.own, &DEVICES, plugin, devices, reply, ctr)
    }

    fn env(&mut self, plugin: &str, env: Vec<api::KeyValue>) -> Result<(), MergeError> {
        const ENV: Keyed<api::KeyValue, String> = Keyed {
            field: Field::Env,
            key: |e| &e.key,
            ctr_has: |e, key| env_has(e, key),
            to_ctr: |e| {
                let mut kv = String::with_capacity(e.key.len() + 1 + e.value.len());
                kv.push_str(&e.key);
                kv.push('=');
                kv.push_str(&e.value);
                kv
            },
        };
        let ctr = &mut self.request.container.mut_or_insert_default().env;
        resources::merge_keyed(&mut self.own, &ENV, plugin, env, &mut self.reply.env, ctr)
    }

    fn args(&mut self, plugin: &str, mut args: Vec<String>) -> Result<(), MergeError> {
        if args.is_empty() {
            return Ok(());
        }
        if args[0].is_empty() {
            // A leading "" overrides whoever set the args before.
            self.own.clear_simple(Field::Args, plugin);
            args.remove(0);
        }
        self.own.claim_simple(Field::Args, plugin)?;
        self.request.container.mut_or_insert_default().args = args.clone();
        self.reply.args = args;
        Ok(())
    }

    fn hooks(&mut self, plugin: &str, h: api::Hooks) {
        let reply = self.reply.hooks.mut_or_insert_default();
        let ctr = self
            .request
            .container
            .mut_or_insert_default()
            .hooks
            .mut_or_insert_default();
        let mut claim = false;
        for (src, r, c) in [
            (h.prestart, &mut reply.prestart, &mut ctr.prestart),
            (h.create_runtime, &mut reply.create_runtime, &mut ctr.create_runtime),
            (
                h.create_container,
                &mut reply.create_container,
                &mut ctr.create_container,
            ),
            (h.start_container, &mut reply.start_container, &mut ctr.start_container),
            (h.poststart, &mut reply.poststart, &mut ctr.poststart),
            (h.poststop, &mut reply.poststop, &mut ctr.poststop),
        ] {
            if !src.is_empty() {
                r.extend(src.iter().cloned());
                c.extend(src);
                claim = true;
            }
        }
        if claim {
            self.own.accumulate(Field::OciHooks, plugin);
        }
    }

    fn resources(&mut self, plugin: &str, r: api::LinuxResources) -> Result<(), MergeError> {
        let ctr = self
            .request
            .container
            .mut_or_insert_default()
            .linux
            .mut_or_insert_default()
            .resources
            .mut_or_insert_default();
        let reply = self
            .reply
            .linux
            .mut_or_insert_default()
            .resources
            .mut_or_insert_default();
        // Device cgroup rules are appended, never conflict-checked (upstream).
        resources::merge(&mut self.own, plugin, &r, &mut [ctr, reply], Rules::Append)
    }

    fn linux_simple(
        &mut self,
        plugin: &str,
        cgroups_path: String,
        oom: MessageField<api::OptionalInt>,
        io: MessageField<api::LinuxIOPriority>,
        seccomp: MessageField<api::LinuxSeccomp>,
    ) -> Result<(), MergeError> {
        if !cgroups_path.is_empty() {
            self.own.claim_simple(Field::CgroupsPath, plugin)?;
            self.ctr_linux().cgroups_path = cgroups_path.clone();
            self.reply_linux().cgroups_path = cgroups_path;
        }
        if let Some(v) = oom.into_option() {
            self.own.claim_simple(Field::OomScoreAdj, plugin)?;
            self.ctr_linux().oom_score_adj = MessageField::some(v.clone());
            self.reply_linux().oom_score_adj = MessageField::some(v);
        }
        if let Some(v) = io.into_option() {
            self.own.claim_simple(Field::IoPriority, plugin)?;
            self.ctr_linux().io_priority = MessageField::some(v.clone());
            self.reply_linux().io_priority = MessageField::some(v);
        }
        if let Some(v) = seccomp.into_option() {
            self.own.claim_simple(Field::SeccompPolicy, plugin)?;
            self.ctr_linux().seccomp_policy = MessageField::some(v.clone());
            self.reply_linux().seccomp_policy = MessageField::some(v);
        }
        Ok(())
    }

    fn namespaces(&mut self, plugin: &str, nss: Vec<api::LinuxNamespace>) -> Result<(), MergeError> {
        for n in nss {
            let (key, removal) = match removal_key(&n.type_) {
                Some(k) => (k.to_string(), true),
                None => (n.type_.clone(), false),
            };
            // Removals claim too: a second plugin touching the type conflicts.
            self.own.claim_compound(Field::Namespace, &key, plugin)?;
            let ctr = &mut self.ctr_linux().namespaces;
            if removal {
                ctr.retain(|x| x.type_ != key);
            } else if let Some(existing) = ctr.iter_mut().find(|x| x.type_ == key) {
                *existing = n.clone();
            } else {
                ctr.push(n.clone());
            }
            self.reply_linux().namespaces.push(n);
        }
        Ok(())
    }

    fn rdt(&mut self, plugin: &str, rdt: api::LinuxRdt) -> Result<(), MergeError> {
        if rdt.remove {
            for f in [Field::RdtClosID, Field::RdtSchemata, Field::RdtEnableMonitoring] {
                self.own.clear_simple(f, plugin);
            }
            self.reply_linux().rdt = MessageField::some(api::LinuxRdt {
                remove: true,
                ..Default::default()
            });
        }
        if let Some(v) = rdt.clos_id.into_option() {
            self.own.claim_simple(Field::RdtClosID, plugin)?;
            let r = self.reply_linux().rdt.mut_or_insert_default();
            r.clos_id = MessageField::some(v);
            r.remove = false;
        }
        if let Some(v) = rdt.schemata.into_option() {
            self.own.claim_simple(Field::RdtSchemata, plugin)?;
            let r = self.reply_linux().rdt.mut_or_insert_default();
            r.schemata = MessageField::some(v);
            r.remove = false;
        }
        if let Some(v) = rdt.enable_monitoring.into_option() {
            self.own.claim_simple(Field::RdtEnableMonitoring, plugin)?;
            let r = self.reply_linux().rdt.mut_or_insert_default();
            r.enable_monitoring = MessageField::some(v);
            r.remove = false;
        }
        Ok(())
    }
}
