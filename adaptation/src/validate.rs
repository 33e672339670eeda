//! Validation of merged adjustments: which plugins count as present, the
//! validators' run after the CreateContainer merge, and the built-in
//! default validator (NRI `plugins/default-validator`, containerd's
//! `[nri.default_validator]`).

use std::sync::Arc;

use futures::future::join_all;
use nri_proto::api::{self, Event, Field, security_profile::ProfileType};

use crate::{
    error::{Error, ValidationError},
    plugin::{Joined, Plugin},
    registry::{Registry, turns::Turn},
    result::PendingOwners,
    result::owners::Owners,
};

/// Name of the built-in validator's plugin record (`IDX-NAME`).
pub const DEFAULT_VALIDATOR_NAME: &str = "00-default-validator";

/// Pod annotation listing plugins that must have processed a container
/// (NRI `required-plugins.noderesource.dev`). Looked up as
/// `<key>/container.<name>`, then `<key>/pod`, then `<key>`.
pub const REQUIRED_PLUGINS_ANNOTATION: &str = "required-plugins.noderesource.dev";

/// Settings of the default validator, with containerd's option names.
/// Every check is off by default, as upstream.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DefaultValidatorConfig {
    /// Run the default validator at all.
    pub enable: bool,
    /// Reject any OCI hook injection.
    pub reject_oci_hook_adjustment: bool,
    /// Reject seccomp changes of containers with the runtime default profile.
    pub reject_runtime_default_seccomp_adjustment: bool,
    /// Reject seccomp changes of unconfined containers (or without a profile).
    pub reject_unconfined_seccomp_adjustment: bool,
    /// Reject seccomp changes of containers with a localhost (custom) profile.
    pub reject_custom_seccomp_adjustment: bool,
    /// Reject any namespace change.
    pub reject_namespace_adjustment: bool,
    /// Reject any sysctl change.
    pub reject_sysctl_adjustment: bool,
    /// Plugins (`NAME` or `IDX-NAME`) that must have processed every container.
    pub required_plugins: Vec<String>,
    /// Pod annotation key that, set to true, skips the required-plugins check.
    pub tolerate_missing_plugins_annotation: String,
}

/// The annotation of `pod` for `key` as seen by container `container`:
/// `key/container.<name>`, else `key/pod`, else `key`.
pub fn effective_annotation<'a>(pod: &'a api::PodSandbox, key: &str, container: &str) -> Option<&'a str> {
    [
        format!("{key}/container.{container}"),
        format!("{key}/pod"),
        key.to_string(),
    ]
    .iter()
    .find_map(|k| pod.annotations.get(k))
    .map(String::as_str)
}

/// Parses a list of plugin names given as a JSON array, a YAML flow
/// sequence (`[a, b]`) or a YAML block sequence (`- a` lines). Those are
/// the forms the upstream YAML parser accepts for a list of names.
///
/// # Errors
/// Text describing what is not a list of names.
pub fn parse_name_list(value: &str) -> Result<Vec<String>, String> {
    let v = value.trim();
    if v.is_empty() {
        return Ok(Vec::new());
    }
    if let Ok(list) = serde_json::from_str::<Vec<String>>(v) {
        return Ok(list);
    }
    let unquote = |s: &str| -> Result<String, String> {
        let s = s.trim();
        let s = s
            .strip_prefix('"')
            .and_then(|x| x.strip_suffix('"'))
            .or_else(|| s.strip_prefix('\'').and_then(|x| x.strip_suffix('\'')))
            .unwrap_or(s);
        if s.is_empty() || s.contains(['[', ']', '{', '}', ':', ',']) {
            Err(format!("{s:?} is not a plugin name"))
        } else {
            Ok(s.to_string())
        }
    };
    if let Some(inner) = v.strip_prefix('[').and_then(|x| x.strip_suffix(']')) {
        return inner.split(',').filter(|s| !s.trim().is_empty()).map(unquote).collect();
    }
    v.lines()
        .filter(|l| !l.trim().is_empty())
        .map(
            |l| match l.trim().strip_prefix("- ").or_else(|| l.trim().strip_prefix('-')) {
                Some(item) => unquote(item),
                None => Err(format!("line {l:?} is not a list item")),
            },
        )
        .collect()
}

fn parse_bool(v: &str) -> Option<bool> {
    // strconv.ParseBool's spellings.
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The built-in validator.
#[derive(Debug, Clone)]
pub struct DefaultValidator {
    cfg: DefaultValidatorConfig,
}

impl DefaultValidator {
    /// A validator with `cfg`.
    pub fn new(cfg: DefaultValidatorConfig) -> Self {
        DefaultValidator { cfg }
    }

    /// Checks, in upstream's order: OCI hooks, seccomp, namespaces,
    /// required plugins, sysctl. Returns the rejection reason, which starts
    /// with `validation error:` like upstream's.
    pub fn validate(&self, req: &api::ValidateContainerAdjustmentRequest) -> Result<(), String> {
        let owners = Owners::from_proto(req.owners.get_or_default().clone());
        let id = req.container.id.as_str();
        let c = &self.cfg;
        if c.reject_oci_hook_adjustment
            && let Some(o) = owners.simple_owner(id, Field::OciHooks)
        {
            let who = if o.contains(',') {
                format!("plugins {o:?}")
            } else {
                format!("plugin {o:?}")
            };
            return Err(format!(
                "validation error: {who} attempted restricted OCI hook injection"
            ));
        }
        if let Some(owner) = owners.simple_owner(id, Field::SeccompPolicy) {
            let profile = req.container.linux.seccomp_profile.as_ref();
            let kind = profile.map(|p| p.profile_type.enum_value_or_default());
            let reject = match kind {
                None | Some(ProfileType::UNCONFINED) => c.reject_unconfined_seccomp_adjustment.then_some("unconfined"),
                Some(ProfileType::RUNTIME_DEFAULT) => {
                    c.reject_runtime_default_seccomp_adjustment.then_some("runtime default")
                }
                Some(ProfileType::LOCALHOST) => c.reject_custom_seccomp_adjustment.then_some("custom"),
            };
            if let Some(what) = reject {
                return Err(format!(
                    "validation error: plugin {owner} attempted restricted {what} seccomp policy adjustment"
                ));
            }
        }
        if c.reject_namespace_adjustment
            && let Some(map) = owners.compound_owners(id, Field::Namespace)
            && !map.is_empty()
        {
            let mut list: Vec<_> = map.iter().collect();
            list.sort();
            let offenders: Vec<String> = list.iter().map(|(ns, p)| format!("{p:?} (namespace {ns:?})")).collect();
            return Err(format!(
                "validation error: attempted restricted namespace adjustment by plugin(s) {}",
                offenders.join(", ")
            ));
        }
        self.required_plugins(req)?;
        if c.reject_sysctl_adjustment {
            let mut offenders: Vec<&str> = req
                .adjust
                .linux
                .sysctl
                .keys()
                .filter_map(|k| owners.compound_owner(id, Field::Sysctl, k))
                .collect();
            offenders.sort();
            if !offenders.is_empty() {
                return Err(format!(
                    "validation error: attempted restricted sysctl adjustment by plugin(s) {}",
                    offenders.join(", ")
                ));
            }
        }
        Ok(())
    }

    fn required_plugins(&self, req: &api::ValidateContainerAdjustmentRequest) -> Result<(), String> {
        let pod = req.pod.get_or_default();
        let name = req.container.name.as_str();
        let tolerate_key = &self.cfg.tolerate_missing_plugins_annotation;
        if !tolerate_key.is_empty()
            && let Some(v) = effective_annotation(pod, tolerate_key, name)
        {
            match parse_bool(v) {
                Some(true) => return Ok(()),
                Some(false) => {}
                None => {
                    return Err(format!("invalid {tolerate_key} annotation {v:?}: not a boolean"));
                }
            }
        }
        let mut required = self.cfg.required_plugins.clone();
        if let Some(v) = effective_annotation(pod, REQUIRED_PLUGINS_ANNOTATION, name) {
            let list = parse_name_list(v)
                .map_err(|e| format!("invalid {REQUIRED_PLUGINS_ANNOTATION} annotation {v:?}: {e}"))?;
            required.extend(list);
        }
        let present = |r: &str| {
            req.plugins
                .iter()
                .any(|p| p.name == r || format!("{}-{}", p.index, p.name) == r)
        };
        let missing: Vec<&str> = required.iter().map(String::as_str).filter(|r| !present(r)).collect();
        match missing.len() {
            0 => Ok(()),
            1 => Err(format!(
                "validation error: required plugin {:?} not present",
                missing[0]
            )),
            _ => Err(format!(
                "validation error: required plugins {:?} not present",
                missing.join(",")
            )),
        }
    }
}

/// The validation of one CreateContainer: set up before the plugins are
/// called (the merge keeps the pristine container only when someone will
/// validate), told which plugins are present, run after the merge.
pub(crate) struct Validation<'a> {
    /// The default validator's settings, when it is enabled.
    default: Option<&'a DefaultValidatorConfig>,
    /// Plugins present for validation; `None` without validators, so no
    /// list is built that nobody reads.
    present: Option<Vec<api::PluginInstance>>,
}

fn instance(idx: &str, base: &str) -> api::PluginInstance {
    api::PluginInstance {
        name: base.to_string(),
        index: idx.to_string(),
        ..Default::default()
    }
}

impl<'a> Validation<'a> {
    /// Validation with the default validator `cfg` (when enabled) and the
    /// plugins of `plugins` that subscribe to ValidateContainerAdjustment.
    pub fn new(cfg: &'a DefaultValidatorConfig, plugins: &'a [Arc<Plugin>]) -> Self {
        let default = cfg.enable.then_some(cfg);
        let active = default.is_some()
            || plugins
                .iter()
                .any(|p| p.subscribed(Event::VALIDATE_CONTAINER_ADJUSTMENT));
        let present = active.then(|| match default {
            Some(_) => vec![instance("00", "default-validator")],
            None => Vec::new(),
        });
        Validation { default, present }
    }

    /// Whether any validator will run.
    pub fn is_active(&self) -> bool {
        self.present.is_some()
    }

    /// Counts `p` as present: a plugin that does not handle CreateContainer
    /// (if still connected), or one that answered it. A plugin that failed
    /// or timed out does not count (fix of NRI #316, case R5).
    pub fn present(&mut self, p: &Plugin) {
        if let Some(list) = &mut self.present {
            list.push(instance(&p.idx, &p.base));
        }
    }

    /// Runs every validator of `validators` (each with its turn) side by
    /// side; the first rejection or failure in plugin order (the built-in
    /// validator first) fails the create. A validator whose connection
    /// failed is removed from `registry`; one whose sync failed is passed by.
    pub async fn run(
        self,
        registry: &Registry,
        validators: Vec<(Arc<Plugin>, Turn)>,
        pod: api::PodSandbox,
        pristine: api::Container,
        rsp: &api::CreateContainerResponse,
        owners: PendingOwners,
    ) -> Result<(), Error> {
        let Some(present) = self.present else {
            return Ok(());
        };
        if validators.is_empty() && self.default.is_none() {
            return Ok(());
        }
        let req = api::ValidateContainerAdjustmentRequest {
            pod: protobuf::MessageField::some(pod),
            container: protobuf::MessageField::some(pristine),
            adjust: rsp.adjust.clone(),
            update: rsp.update.clone(),
            owners: protobuf::MessageField::some(owners.into_owners().into_proto()),
            plugins: present,
            ..Default::default()
        };
        if let Some(cfg) = self.default
            && let Err(reason) = DefaultValidator::new(cfg.clone()).validate(&req)
        {
            return Err(ValidationError::Rejected {
                validator: DEFAULT_VALIDATOR_NAME.to_string(),
                reason,
            }
            .into());
        }
        let results = join_all(validators.into_iter().map(|(p, turn)| {
            let req = &req;
            async move {
                turn.ready().await;
                if p.joined() == Joined::Failed {
                    return (p, None);
                }
                let r = p.validate(req).await;
                drop(turn);
                (p, Some(r))
            }
        }))
        .await;
        let mut first = None;
        for (p, r) in results {
            let Some(r) = r else { continue };
            let err = match r {
                Ok(v) if !v.reject => continue,
                Ok(v) => ValidationError::Rejected {
                    validator: p.name().to_string(),
                    reason: if v.reason.is_empty() {
                        "unknown rejection reason".to_string()
                    } else {
                        v.reason
                    },
                },
                Err(e) => {
                    if e.is_fatal() {
                        registry.remove(&p).await;
                    }
                    ValidationError::Failed {
                        validator: p.name().to_string(),
                        source: e,
                    }
                }
            };
            first.get_or_insert(err);
        }
        match first {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
