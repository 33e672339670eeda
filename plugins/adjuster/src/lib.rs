//! # nri-adjuster
//!
//! A sample NRI plugin that adjusts containers declaratively: a TOML file
//! holds rules; each rule says which containers it applies to (`[match]`)
//! and what to change in them (`[adjust]`): environment variables,
//! annotations, mounts, devices, CPU, memory and pids limits, rlimits and
//! the OOM score. The plugin subscribes to CreateContainer only.
//!
//! Every rule that matches a container contributes, in file order; the
//! plugin answers with one merged adjustment in which a later rule
//! overrides an earlier one key by key (the same environment variable,
//! annotation, mount destination, device path, rlimit type or resource
//! field), so no key is sent twice (the runtime would take that for a
//! conflict). Other plugins setting the same keys do conflict, as with any
//! NRI plugin.
//!
//! ## Running it
//!
//! ```sh
//! # external plugin
//! nri-adjuster --socket-path /var/run/nri/nri.sock --idx 10 --config /etc/nri-adjuster.toml
//! # pre-installed plugin, launched by the runtime, configured from its drop-in directory
//! cp nri-adjuster /opt/nri/plugins/10-adjuster
//! cp adjuster.toml /etc/nri/conf.d/10-adjuster.conf
//! ```
//!
//! | flag | default | what |
//! |---|---|---|
//! | `--socket-path PATH` | `/var/run/nri/nri.sock` | the runtime's NRI socket (ignored when the runtime launched the plugin) |
//! | `--idx NN` | `NRI_PLUGIN_IDX`, an `IDX-NAME` executable name, else `10` | plugin index |
//! | `--name NAME` | `NRI_PLUGIN_NAME`, an `IDX-NAME` executable name, else the executable's name | plugin name |
//! | `--config FILE` | none | the rules |
//!
//! The configuration the runtime sends in Configure (for a pre-installed
//! plugin, the drop-in file `IDX-NAME.conf` or `NAME.conf` of its
//! configuration directory) takes precedence over `--config`. An invalid
//! configuration is an error naming the rule and the key: from `--config`
//! the plugin exits with status 1 before connecting; from the runtime it
//! fails Configure, so the runtime does not start it.
//!
//! ## Configuration
//!
//! A list of `[[rule]]` tables; nothing else at the top level. Unknown keys
//! are errors everywhere.
//!
//! ### `[[rule]]`
//!
//! | key | type | what |
//! |---|---|---|
//! | `name` | string, optional | shown in logs and errors (else the rule's number, from 1) |
//! | `match` | table, optional | which containers; without it, every container |
//! | `adjust` | table, required | what to change; must change something |
//!
//! ### `[rule.match]`
//!
//! Every key given must hold.
//!
//! | key | type | matched against |
//! |---|---|---|
//! | `pod_name` | pattern | the pod's name |
//! | `pod_namespace` | pattern | the pod's namespace |
//! | `container_name` | pattern | the container's name |
//! | `annotations` | table of string = string | each annotation must have exactly that value on the pod, or else on the container |
//!
//! A pattern is an exact name, or a glob where `*` stands for any run of
//! characters (`web-*`, `*-sidecar`, `*`). Other glob syntax (`?`, `[...]`,
//! `{...}`, `\`) and the empty pattern are errors.
//!
//! ### `[rule.adjust]`
//!
//! | key | type | what |
//! |---|---|---|
//! | `env` | table of string = string | environment variables to set; the value `"-"` removes the variable |
//! | `annotations` | table of string = string | annotations to set; the value `"-"` removes the annotation |
//! | `mounts` | array of tables | mounts to add; one with the destination of an existing mount replaces it |
//! | `devices` | array of tables | device nodes to add; one with the path of an existing device replaces it |
//! | `cpu` | table | CPU settings |
//! | `memory` | table | memory settings |
//! | `pids` | table | `limit`: maximum number of tasks, `-1` unlimited |
//! | `rlimits` | array of tables | POSIX rlimits; one replaces an existing limit of its type |
//! | `oom_score_adj` | integer | OOM score adjustment, -1000..=1000 |
//!
//! A mount (`mounts` element):
//!
//! | key | type | what |
//! |---|---|---|
//! | `destination` | string, required | absolute path in the container; unique within a rule |
//! | `source` | string | host path, or e.g. `tmpfs` |
//! | `type` | string | file system type: `bind`, `tmpfs`, ... |
//! | `options` | array of strings | mount options: `rbind`, `ro`, `nosuid`, `size=16m`, ... |
//!
//! A device (`devices` element):
//!
//! | key | type | what |
//! |---|---|---|
//! | `path` | string, required | absolute path in the container; unique within a rule |
//! | `type` | string, required | `b` (block), `c` (character), `u` (unbuffered character), `p` (FIFO) |
//! | `major`, `minor` | integer | device numbers; required except for `p` |
//! | `file_mode` | integer | permission bits, e.g. `0o666` (TOML octal) |
//! | `uid`, `gid` | integer | owner and group |
//!
//! `cpu`:
//!
//! | key | type | what |
//! |---|---|---|
//! | `shares` | integer ≥ 0 | relative weight |
//! | `quota` | integer | microseconds per period, `-1` unlimited |
//! | `period` | integer | period in microseconds, 1000..=1000000 |
//! | `cpus`, `mems` | string | CPUs and memory nodes, cpuset syntax (`0-3,6`) |
//!
//! `memory` (byte counts are integers in bytes, `-1` unlimited, or strings
//! with a Kubernetes-style unit: `k`, `M`, `G`, `T` for powers of 1000,
//! `Ki`, `Mi`, `Gi`, `Ti` for powers of 1024, e.g. `"128Mi"`):
//!
//! | key | type | what |
//! |---|---|---|
//! | `limit` | byte count | memory limit; not `0` (the runtime would take it for "no limit") |
//! | `reservation` | byte count | soft limit |
//! | `swap` | byte count | memory plus swap limit; not `0`; with a `limit` in the same rule, at least that limit (or `-1`) |
//! | `swappiness` | integer | 0..=100 |
//! | `disable_oom_killer` | boolean | disables the OOM killer |
//!
//! An rlimit (`rlimits` element): `type` (`RLIMIT_NOFILE`, `RLIMIT_NPROC`,
//! ... as in the OCI runtime spec; unique within a rule), `hard` and `soft`
//! (integers, `soft` ≤ `hard`).
//!
//! ### Example
//!
//! `testdata/plugins/adjuster.toml`:
//!
//! ```toml
#![doc = include_str!("../../../testdata/plugins/adjuster.toml")]
//! ```
//!
//! ```
//! use nri_adjuster::{Config, api};
//!
//! let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/plugins/adjuster.toml")).unwrap();
//! let cfg = Config::parse(&text).unwrap();
//! let pod = api::PodSandbox { name: "web".into(), namespace: "default".into(), ..Default::default() };
//! let app = api::Container { name: "app".into(), ..Default::default() };
//! let rsp = nri_adjuster::response_for(&cfg, &pod, &app);
//! let adj = rsp.adjust.unwrap();
//! assert_eq!(adj.env[0].key, "FOO");
//! assert_eq!(adj.linux.resources.memory.limit.value, 128 << 20);
//!
//! let other = api::Container { name: "sidecar".into(), ..Default::default() };
//! assert!(nri_adjuster::response_for(&cfg, &pod, &other).adjust.is_none());
//! ```

#![warn(missing_docs)]

mod config;
mod merge;
mod pattern;

use std::sync::{Arc, RwLock};

pub use config::{
    Adjust, Bytes, Config, ConfigError, CpuSpec, DeviceSpec, DeviceType, Match, MemorySpec, MountSpec, PidsSpec,
    RLIMIT_TYPES, RlimitSpec, Rule,
};
pub use merge::{Merged, REMOVE};
use nri_proto::sync::{read, write};
pub use nri_stub::api;
use nri_stub::{BoxError, EventMask, Plugin};
pub use pattern::{Pattern, PatternError};

/// The events the adjuster subscribes to: CreateContainer.
pub fn events() -> EventMask {
    EventMask::from_events(&[api::Event::CREATE_CONTAINER])
}

/// The merged response of every rule of `cfg` matching container `c` of
/// `pod` (an empty response when none does).
pub fn response_for(cfg: &Config, pod: &api::PodSandbox, c: &api::Container) -> api::CreateContainerResponse {
    let mut merged = Merged::new();
    for (_, rule) in cfg.matching(pod, c) {
        merged.add(&rule.adjust);
    }
    merged.to_response()
}

/// The adjuster plugin.
pub struct Adjuster {
    config: RwLock<Arc<Config>>,
}

impl Adjuster {
    /// An adjuster applying `config` (e.g. from `--config`) until the
    /// runtime sends a configuration of its own.
    pub fn new(config: Config) -> Adjuster {
        Adjuster {
            config: RwLock::new(Arc::new(config)),
        }
    }

    /// The configuration in effect.
    pub fn config(&self) -> Arc<Config> {
        read(&self.config).clone()
    }
}

#[nri_stub::async_trait]
impl Plugin for Adjuster {
    async fn configure(&self, req: &api::ConfigureRequest) -> Result<EventMask, BoxError> {
        if !req.config.trim().is_empty() {
            let cfg = Config::parse(&req.config).map_err(|e| format!("configuration from the runtime: {e}"))?;
            tracing::info!(rules = cfg.rules.len(), "using the configuration from the runtime");
            *write(&self.config) = Arc::new(cfg);
        }
        if self.config().rules.is_empty() {
            tracing::warn!("no rules configured: containers are left unchanged");
        }
        Ok(events())
    }

    async fn create_container(
        &self,
        pod: &api::PodSandbox,
        c: &api::Container,
    ) -> Result<api::CreateContainerResponse, BoxError> {
        let cfg = self.config();
        let matched = cfg.matching(pod, c);
        if matched.is_empty() {
            tracing::debug!(pod = %format!("{}/{}", pod.namespace, pod.name), container = %c.name, "no rule matches");
            return Ok(api::CreateContainerResponse::new());
        }
        let mut merged = Merged::new();
        for (_, rule) in &matched {
            merged.add(&rule.adjust);
        }
        let rules: Vec<String> = matched.iter().map(|(n, r)| r.label(*n)).collect();
        tracing::info!(
            pod = %format!("{}/{}", pod.namespace, pod.name),
            container = %format!("{} ({})", c.name, c.id),
            rules = %rules.join(","),
            "adjusting container"
        );
        Ok(merged.to_response())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> String {
        std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../testdata/plugins/adjuster.toml"
        ))
        .unwrap()
    }

    fn pod(ann: &[(&str, &str)]) -> api::PodSandbox {
        let mut p = api::PodSandbox {
            id: "p1".into(),
            name: "web".into(),
            namespace: "default".into(),
            ..Default::default()
        };
        for (k, v) in ann {
            p.annotations.insert(k.to_string(), v.to_string());
        }
        p
    }

    fn ctr(name: &str) -> api::Container {
        api::Container {
            id: "c1".into(),
            name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn example_config_adjusts_app_and_opted_in_containers_once() {
        let cfg = Config::parse(&example()).unwrap();
        assert_eq!(cfg.rules.len(), 2);
        let opt_in = [("nri.example.com/adjust", "true")];
        let both = response_for(&cfg, &pod(&opt_in), &ctr("app"));
        let only_first = response_for(&cfg, &pod(&[]), &ctr("app"));
        assert_eq!(both, only_first, "a container matched by both rules gets each key once");
        let a = both.adjust.unwrap();
        assert_eq!(a.env.len(), 1);
        assert_eq!(
            (a.env[0].key.as_str(), a.env[0].value.as_str()),
            ("FOO", "from-nri-adjuster")
        );
        assert_eq!(a.annotations["nri.example.com/adjusted-by"], "nri-adjuster");
        assert_eq!(a.mounts.len(), 1);
        assert_eq!(
            (a.mounts[0].destination.as_str(), a.mounts[0].type_.as_str()),
            ("/opt/nri", "tmpfs")
        );
        assert_eq!(a.linux.resources.memory.limit.value, 134_217_728);

        assert!(response_for(&cfg, &pod(&opt_in), &ctr("sidecar")).adjust.is_some());
        assert!(response_for(&cfg, &pod(&[]), &ctr("sidecar")).adjust.is_none());
    }

    #[tokio::test]
    async fn runtime_config_takes_precedence_and_a_bad_one_fails_configure() {
        let file = Config::parse("[[rule]]\n[rule.adjust]\nenv = { FROM = \"file\" }\n").unwrap();
        let plugin = Adjuster::new(file);
        let rsp = plugin.create_container(&pod(&[]), &ctr("x")).await.unwrap();
        assert_eq!(rsp.adjust.unwrap().env[0].value, "file");

        // No config from the runtime: the file's rules stay.
        let mask = plugin.configure(&api::ConfigureRequest::new()).await.unwrap();
        assert_eq!(mask, events());
        assert_eq!(plugin.config().rules[0].adjust.env["FROM"], "file");

        let req = api::ConfigureRequest {
            config: "[[rule]]\n[rule.adjust]\nenv = { FROM = \"runtime\" }\n".into(),
            ..Default::default()
        };
        plugin.configure(&req).await.unwrap();
        let rsp = plugin.create_container(&pod(&[]), &ctr("x")).await.unwrap();
        assert_eq!(rsp.adjust.unwrap().env[0].value, "runtime");

        let bad = api::ConfigureRequest {
            config: "[[rule]]\n[rule.adjust]\nenv = { A = \"1\" }\nmemroy = { limit = 1 }\n".into(),
            ..Default::default()
        };
        let e = plugin.configure(&bad).await.unwrap_err().to_string();
        assert!(
            e.contains("configuration from the runtime") && e.contains("memroy"),
            "{e}"
        );
        // The refused configuration changed nothing.
        assert_eq!(plugin.config().rules[0].adjust.env["FROM"], "runtime");
    }
}
