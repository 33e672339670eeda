//! # nri-replay
//!
//! Hosts an NRI [`Adaptation`](nri_adaptation::Adaptation) on a socket, lets real plugins connect (or
//! launches pre-installed ones), then replays a scenario of pod and
//! container lifecycle steps against them and prints, per step, one JSON
//! line: what each plugin answered, the merged adjustment and updates, who
//! owns which field, and for containers given as an OCI `config.json` the
//! adjusted spec. It is how a plugin author tests a plugin without a
//! cluster and how an operator sees which plugin changed what.
//!
//! A scenario (JSON):
//!
//! ```json
//! {
//!   "pods": [{"id": "p1", "name": "web", "namespace": "default", "uid": "u1"}],
//!   "containers": [
//!     {"id": "c1", "pod": "p1", "name": "app", "config": "../oci/busybox.json"},
//!     {"id": "c2", "pod": "p1", "container": {"name": "side", "env": ["A=1"]}}
//!   ],
//!   "steps": [
//!     {"run_pod_sandbox": "p1"},
//!     {"create_container": "c1"},
//!     {"start_container": "c1"},
//!     {"update_container": {"container": "c1", "resources": {"cpu": {"cpus": "0"}}}},
//!     {"stop_container": "c1"},
//!     {"remove_container": "c1"},
//!     {"update_pod_sandbox": {"pod": "p1", "resources": {"cpu": {"shares": {"value": "512"}}}}},
//!     {"stop_pod_sandbox": "p1"},
//!     {"remove_pod_sandbox": "p1"}
//!   ]
//! }
//! ```
//!
//! Pods and containers are NRI objects in protobuf JSON; a container may
//! instead name an OCI `config.json` (relative to the scenario file); its
//! `io.kubernetes.cri.*` name annotations (container-name, sandbox-id,
//! -name, -namespace, -uid), where the file has them, are rewritten to the
//! scenario's container and pod, so one fixture serves many scenarios. Like a
//! runtime, a successful create, start or update step is followed by its
//! Post event.
//!
//! The whole scenario is checked before the first step is sent: pod and
//! container ids are non-empty and unique, each step is an object with
//! exactly one key (the action), names a known pod or container and
//! carries valid NRI JSON. Errors name the entry, e.g. `containers[2]:
//! empty id` or `steps[3] (start_container): unknown container "x"`
//! (indexes from 0). The order of the steps is not checked: a plugin can be
//! sent a lifecycle no runtime would send.

mod run;
mod scenario;

pub use self::{
    run::{ReplayState, replay, runtime_builder, to_json},
    scenario::{ContainerDef, Loaded, Scenario, ScenarioError, Step, load},
};
