//! The NRI audit trail: for every container, what the plugins changed at
//! CreateContainer and which plugin changed each field, kept in the
//! daemon's directory as long as the task exists (`audit/<namespace>/<id>.json`,
//! see [`crate::layout::audit_record`]) and shown by
//! `containerd-shim-nri-shim-v2 inspect <container-id>` without debug logs.
//!
//! The record is written once the container exists (a refused or failed
//! create leaves none) and removed with the task, by the daemon's delete
//! or by `delete` without a daemon.

use std::{
    path::{Path, PathBuf},
    time::SystemTime,
};

use nri_adaptation::{CreateReport, FieldChange, api};

use crate::container::record::RecordError;
use serde::{Deserialize, Serialize};

/// Current [`AuditRecord::version`].
pub const AUDIT_VERSION: u32 = 1;

/// Reading or writing an audit record failed.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The namespace or id cannot name a file (containerd never sends one).
    #[error("task {namespace}/{id}: not usable as a file name")]
    BadName {
        /// The namespace.
        namespace: String,
        /// The task id.
        id: String,
    },
    /// A file or directory could not be read, written or parsed (the
    /// bundle record's errors: each names the path).
    #[error(transparent)]
    File(#[from] RecordError),
}

/// What one plugin did to the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditPlugin {
    /// `IDX-NAME`.
    pub name: String,
    /// Whether it changed any field.
    pub changed: bool,
    /// Why it did not answer (its failure policy let the create go on).
    pub error: Option<String>,
}

/// One container's audit record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// [`AUDIT_VERSION`] when written.
    pub version: u32,
    /// containerd namespace.
    pub namespace: String,
    /// Container (task) id.
    pub id: String,
    /// The pod sandbox id the container was created in.
    pub pod: String,
    /// When the container was created, RFC 3339 UTC.
    pub created: String,
    /// Every plugin called for CreateContainer, in call order.
    pub plugins: Vec<AuditPlugin>,
    /// Who set or removed which field (see [`CreateReport::changes`]).
    pub changes: Vec<FieldChange>,
    /// The merged adjustment applied to the OCI spec, NRI
    /// `ContainerAdjustment` in proto JSON (`{}` when nothing changed).
    pub adjustment: serde_json::Value,
}

impl AuditRecord {
    /// The record of container `id` from its CreateContainer report and the
    /// merged response the spec was adjusted with.
    pub fn new(
        namespace: &str,
        id: &str,
        pod: &str,
        report: &CreateReport,
        response: &api::CreateContainerResponse,
    ) -> AuditRecord {
        let changes = report.changes(id);
        let plugins = report
            .plugins
            .iter()
            .map(|p| AuditPlugin {
                name: p.plugin.clone(),
                changed: changes.iter().any(|c| c.plugin == p.plugin),
                error: p.error.clone(),
            })
            .collect();
        let adjustment = nri_adaptation::convert::to_json(response.adjust.get_or_default());
        AuditRecord {
            version: AUDIT_VERSION,
            namespace: namespace.to_string(),
            id: id.to_string(),
            pod: pod.to_string(),
            created: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            plugins,
            changes,
            adjustment,
        }
    }

    /// The plugins that changed the container, in call order.
    pub fn changed_by(&self) -> Vec<&str> {
        self.plugins
            .iter()
            .filter(|p| p.changed)
            .map(|p| p.name.as_str())
            .collect()
    }

    /// Writes the record under `daemon_dir` (atomically: a reader sees the
    /// old file or the new one).
    ///
    /// # Errors
    /// [`AuditError::BadName`], or [`RecordError::Write`] with the path.
    pub fn write(&self, daemon_dir: &Path) -> Result<PathBuf, AuditError> {
        let path = record_path(daemon_dir, &self.namespace, &self.id)?;
        let write = |p: &Path, e| RecordError::Write {
            path: p.to_path_buf(),
            source: e,
        };
        let dir = path.parent().expect("a record path has a directory");
        // The merged adjustment: what plugins injected, secrets included
        // (see crate::private).
        crate::private::create_dir_all(dir).map_err(|e| write(dir, e))?;
        let text = serde_json::to_vec_pretty(self).expect("an audit record serializes");
        crate::private::write_atomic(&path, "tmp", &text, false).map_err(|e| write(&path, e))?;
        Ok(path)
    }

    /// Removes the record of `namespace/id` under `daemon_dir`; a missing
    /// record is no error (delete is idempotent).
    pub fn remove(daemon_dir: &Path, namespace: &str, id: &str) {
        if let Ok(path) = record_path(daemon_dir, namespace, id) {
            let _ = std::fs::remove_file(path);
        }
    }

    /// The records of container `id` under every daemon of `state_root`,
    /// in namespace `namespace` or in any: one per containerd and namespace
    /// that has a container of that id.
    ///
    /// # Errors
    /// [`RecordError::Read`] when the state root cannot be listed,
    /// [`RecordError::Parse`] for a record that does not parse.
    pub fn find(
        state_root: &Path,
        namespace: Option<&str>,
        id: &str,
    ) -> Result<Vec<(PathBuf, AuditRecord)>, AuditError> {
        let read = |p: &Path, e| RecordError::Read {
            path: p.to_path_buf(),
            source: e,
        };
        let mut found = Vec::new();
        let daemons = match std::fs::read_dir(state_root) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
            Err(e) => return Err(read(state_root, e).into()),
        };
        for daemon in daemons.flatten() {
            let audit = crate::layout::audit_dir(&daemon.path());
            let Ok(namespaces) = std::fs::read_dir(&audit) else {
                continue;
            };
            for ns in namespaces.flatten() {
                if namespace.is_some_and(|want| ns.file_name().to_str() != Some(want)) {
                    continue;
                }
                let path = ns.path().join(format!("{id}.json"));
                let text = match std::fs::read(&path) {
                    Ok(t) => t,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(read(&path, e).into()),
                };
                let record = serde_json::from_slice(&text).map_err(|e| RecordError::Parse {
                    path: path.clone(),
                    source: e,
                })?;
                found.push((path, record));
            }
        }
        found.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(found)
    }

    /// The record as an operator reads it: the container, the plugins
    /// called, one line per changed field (`FIELD KEY PLUGIN`, `removed`
    /// for a removal), then the merged adjustment.
    pub fn render(&self) -> String {
        let mut out = format!(
            "container {}/{} (pod {}), created {}\n",
            self.namespace, self.id, self.pod, self.created
        );
        if self.plugins.is_empty() {
            out.push_str("no NRI plugin was called\n");
            return out;
        }
        out.push_str("plugins called, in order:\n");
        for p in &self.plugins {
            let what = match (&p.error, p.changed) {
                (Some(e), _) => format!("failed: {e}"),
                (None, true) => "changed it".to_string(),
                (None, false) => "no change".to_string(),
            };
            out.push_str(&format!("  {}  {what}\n", p.name));
        }
        if self.changes.is_empty() {
            out.push_str("no field was changed\n");
            return out;
        }
        let rows: Vec<[String; 3]> = self
            .changes
            .iter()
            .map(|c| {
                [
                    c.field.clone(),
                    c.key.clone().unwrap_or_else(|| "-".into()),
                    if c.removed {
                        format!("{} (removed)", c.plugin)
                    } else {
                        c.plugin.clone()
                    },
                ]
            })
            .collect();
        let head = ["FIELD".to_string(), "KEY".to_string(), "SET BY".to_string()];
        let width = |i: usize| rows.iter().chain([&head]).map(|r| r[i].len()).max().unwrap_or(0);
        let (w0, w1) = (width(0), width(1));
        for r in std::iter::once(&head).chain(&rows) {
            out.push_str(&format!("{:w0$}  {:w1$}  {}\n", r[0], r[1], r[2]));
        }
        out.push_str("merged adjustment:\n");
        out.push_str(&serde_json::to_string_pretty(&self.adjustment).unwrap_or_default());
        out.push('\n');
        out
    }
}

/// `daemon_dir/audit/<namespace>/<id>.json`, refusing names that are not a
/// single path component.
fn record_path(daemon_dir: &Path, namespace: &str, id: &str) -> Result<PathBuf, AuditError> {
    let plain = |s: &str| !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('\0');
    if !plain(namespace) || !plain(id) {
        return Err(AuditError::BadName {
            namespace: namespace.to_string(),
            id: id.to_string(),
        });
    }
    Ok(crate::layout::audit_record(daemon_dir, namespace, id))
}

/// `inspect [-namespace NS] <container-id>`: prints the audit records of
/// the container under the configured state root. Exit status 1 when none.
///
/// # Errors
/// No record, or one that cannot be read.
pub fn inspect_action(state_root: &Path, namespace: Option<&str>, id: &str) -> anyhow::Result<String> {
    if id.is_empty() {
        anyhow::bail!("inspect needs a container id");
    }
    // The configured state root first, then those of the daemons running
    // (whatever config they were started with).
    let mut found = Vec::new();
    for root in crate::node::running::state_roots(state_root) {
        found.extend(AuditRecord::find(&root, namespace, id)?);
    }
    if found.is_empty() {
        let ns = namespace.map(|n| format!(" in namespace {n}")).unwrap_or_default();
        anyhow::bail!(
            "no NRI audit record of container {id}{ns} (a container not run by nri-shim, or deleted): {}",
            crate::node::running::not_found_hint(state_root)
        );
    }
    let mut out = String::new();
    for (path, record) in found {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!("# {}\n", path.display()));
        out.push_str(&record.render());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nri_adaptation::PluginResponse;

    fn report() -> CreateReport {
        let mut owners = api::OwningPlugins::new();
        let fo = owners.owners.entry("c1".into()).or_default();
        fo.simple.insert(api::Field::MemLimit as i32, "20-limits".into());
        fo.compound
            .entry(api::Field::Env as i32)
            .or_default()
            .owners
            .insert("FOO".into(), "10-env".into());
        let answered = |name: &str| PluginResponse {
            plugin: name.into(),
            response: Some(api::CreateContainerResponse::new()),
            error: None,
        };
        CreateReport {
            plugins: vec![
                answered("10-env"),
                answered("20-limits"),
                PluginResponse {
                    plugin: "30-broken".into(),
                    response: None,
                    error: Some("deadline exceeded".into()),
                },
            ],
            owners: Some(owners),
        }
    }

    #[test]
    fn a_record_names_who_set_what_and_round_trips() {
        let root = tempfile::tempdir().unwrap();
        let daemon = root.path().join("d1");
        let mut rsp = api::CreateContainerResponse::new();
        rsp.adjust.mut_or_insert_default().env.push(api::KeyValue {
            key: "FOO".into(),
            value: "1".into(),
            ..Default::default()
        });
        let r = AuditRecord::new("k8s.io", "c1", "pod1", &report(), &rsp);
        assert_eq!(r.changed_by(), ["10-env", "20-limits"]);
        assert_eq!(r.adjustment["env"][0]["key"], "FOO");
        let path = r.write(&daemon).unwrap();
        assert_eq!(path, daemon.join("audit/k8s.io/c1.json"));
        let found = AuditRecord::find(root.path(), Some("k8s.io"), "c1").unwrap();
        assert_eq!(found, [(path.clone(), r.clone())]);
        let text = r.render();
        assert!(text.contains("30-broken  failed: deadline exceeded"), "{text}");
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("10-env") || l.contains("20-limits"))
            .collect();
        assert!(
            lines
                .iter()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["Env", "FOO", "10-env"]),
            "{text}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["MemLimit", "-", "20-limits"]),
            "{text}"
        );
        AuditRecord::remove(&daemon, "k8s.io", "c1");
        assert!(!path.exists());
        assert!(AuditRecord::find(root.path(), None, "c1").unwrap().is_empty());
    }

    #[test]
    fn inspect_finds_records_per_namespace_and_says_when_there_is_none() {
        let root = tempfile::tempdir().unwrap();
        let rsp = api::CreateContainerResponse::new();
        for (daemon, ns) in [("d1", "default"), ("d2", "k8s.io")] {
            AuditRecord::new(ns, "c1", "p", &report(), &rsp)
                .write(&root.path().join(daemon))
                .unwrap();
        }
        let both = inspect_action(root.path(), None, "c1").unwrap();
        assert!(
            both.contains("container default/c1") && both.contains("container k8s.io/c1"),
            "{both}"
        );
        let one = inspect_action(root.path(), Some("k8s.io"), "c1").unwrap();
        assert!(!one.contains("default/c1"), "{one}");
        let e = inspect_action(root.path(), None, "c9").unwrap_err().to_string();
        assert!(e.contains("no NRI audit record of container c9"), "{e}");
    }

    #[test]
    fn a_name_with_a_path_separator_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let r = AuditRecord::new(
            "../x",
            "c1",
            "p",
            &CreateReport::default(),
            &api::CreateContainerResponse::new(),
        );
        assert!(matches!(r.write(dir.path()), Err(AuditError::BadName { .. })));
    }
}
