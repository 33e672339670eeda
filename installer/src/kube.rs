//! The two Kubernetes API requests the installer makes, with the pod's
//! service account (token, cluster CA and namespace from its mounted
//! directory, the API server from `KUBERNETES_SERVICE_HOST`/`_PORT`):
//!
//! - `PATCH /api/v1/nodes/<node>` (a JSON merge patch setting or removing
//!   one label);
//! - `GET /apis/apps/v1/namespaces/<ns>/daemonsets/<name>` (on SIGTERM:
//!   was the DaemonSet deleted, or is this pod only being replaced?).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use ureq::tls::{PemItem, RootCerts, TlsConfig};

/// Where a pod's service account is mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Why a request failed; each names the object and the API's answer.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// A service account file is missing or unreadable.
    #[error("{path}: {source} (is a service account mounted into the pod?)")]
    Account {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `ca.crt` holds no certificate.
    #[error("{path}: no PEM certificate in it")]
    NoCa {
        /// The file.
        path: PathBuf,
    },
    /// No API server address.
    #[error("no API server: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are unset and --api-server not given")]
    NoServer,
    /// The request did not get an answer.
    #[error("{method} {url}: {source}")]
    Transport {
        /// The method.
        method: &'static str,
        /// The URL.
        url: String,
        /// The cause.
        #[source]
        source: Box<ureq::Error>,
    },
    /// The API answered with an error status.
    #[error("{method} {url}: HTTP {status}: {message}")]
    Status {
        /// The method.
        method: &'static str,
        /// The URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The API's `Status.message`, else the body.
        message: String,
    },
}

/// What became of the DaemonSet that owns this pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DaemonSetState {
    /// It exists and is not being deleted: this pod is being replaced
    /// (image update, rollout restart, node shutdown).
    Present,
    /// It is being deleted (foreground deletion) or is gone.
    Deleted,
    /// The API refused to say (HTTP 403): the RBAC deployed with it is
    /// being deleted too.
    Forbidden,
}

/// A client of one API server with one service account.
pub struct Client {
    agent: ureq::Agent,
    server: String,
    token_file: PathBuf,
    /// The pod's namespace (the service account's `namespace` file).
    pub namespace: String,
}

fn read(path: &Path) -> Result<String, KubeError> {
    std::fs::read_to_string(path).map_err(|source| KubeError::Account {
        path: path.to_path_buf(),
        source,
    })
}

impl Client {
    /// The in-cluster client: `account_dir` holds `token`, `ca.crt` and
    /// `namespace`; `server` is `https://host:port`, else taken from
    /// `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`.
    ///
    /// # Errors
    /// A missing file, a CA without certificate, no server.
    pub fn in_cluster(account_dir: &Path, server: Option<&str>) -> Result<Client, KubeError> {
        let server = match server {
            Some(s) => s.trim_end_matches('/').to_string(),
            None => {
                let host = std::env::var("KUBERNETES_SERVICE_HOST").map_err(|_| KubeError::NoServer)?;
                let port = std::env::var("KUBERNETES_SERVICE_PORT").map_err(|_| KubeError::NoServer)?;
                if host.contains(':') {
                    format!("https://[{host}]:{port}")
                } else {
                    format!("https://{host}:{port}")
                }
            }
        };
        let ca_path = account_dir.join("ca.crt");
        let ca = std::fs::read(&ca_path).map_err(|source| KubeError::Account {
            path: ca_path.clone(),
            source,
        })?;
        let certs: Vec<_> = ureq::tls::parse_pem(&ca)
            .filter_map(|i| match i {
                Ok(PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect();
        if certs.is_empty() {
            return Err(KubeError::NoCa { path: ca_path });
        }
        let namespace = read(&account_dir.join("namespace"))?.trim().to_string();
        let token_file = account_dir.join("token");
        read(&token_file)?;
        let tls = TlsConfig::builder()
            .root_certs(RootCerts::new_with_certs(&certs))
            .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .build();
        let agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .new_agent();
        Ok(Client {
            agent,
            server,
            token_file,
            namespace,
        })
    }

    /// The bearer token, read again for each request (kubelet rotates
    /// projected tokens).
    fn token(&self) -> Result<String, KubeError> {
        Ok(read(&self.token_file)?.trim().to_string())
    }

    fn check(method: &'static str, url: &str, mut resp: ureq::http::Response<ureq::Body>) -> Result<String, KubeError> {
        let status = resp.status().as_u16();
        let body = resp.body_mut().read_to_string().unwrap_or_default();
        if (200..300).contains(&status) {
            return Ok(body);
        }
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_string))
            .unwrap_or(body);
        Err(KubeError::Status {
            method,
            url: url.to_string(),
            status,
            message,
        })
    }

    /// Sets label `key` of node `node` to `value`, or removes it (`None`),
    /// with a JSON merge patch (other labels untouched).
    ///
    /// # Errors
    /// [`KubeError`] naming the node's URL and the API's answer.
    pub fn label_node(&self, node: &str, key: &str, value: Option<&str>) -> Result<(), KubeError> {
        let url = format!("{}/api/v1/nodes/{node}", self.server);
        let patch = serde_json::json!({ "metadata": { "labels": { key: value } } }).to_string();
        let resp = self
            .agent
            .patch(&url)
            .header("Authorization", &format!("Bearer {}", self.token()?))
            .header("Content-Type", "application/merge-patch+json")
            .header("Accept", "application/json")
            .send(patch.as_bytes())
            .map_err(|e| KubeError::Transport {
                method: "PATCH",
                url: url.clone(),
                source: Box::new(e),
            })?;
        Self::check("PATCH", &url, resp).map(|_| ())
    }

    /// Whether DaemonSet `name` of this pod's namespace still exists.
    ///
    /// # Errors
    /// No answer, or an error status other than 403 and 404.
    pub fn daemonset(&self, name: &str) -> Result<DaemonSetState, KubeError> {
        let url = format!(
            "{}/apis/apps/v1/namespaces/{}/daemonsets/{name}",
            self.server, self.namespace
        );
        let resp = self
            .agent
            .get(&url)
            .header("Authorization", &format!("Bearer {}", self.token()?))
            .header("Accept", "application/json")
            .call()
            .map_err(|e| KubeError::Transport {
                method: "GET",
                url: url.clone(),
                source: Box::new(e),
            })?;
        match resp.status().as_u16() {
            404 => return Ok(DaemonSetState::Deleted),
            403 => return Ok(DaemonSetState::Forbidden),
            _ => {}
        }
        let body = Self::check("GET", &url, resp)?;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        Ok(
            if v.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null()) {
                DaemonSetState::Deleted
            } else {
                DaemonSetState::Present
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_service_account_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = Client::in_cluster(dir.path(), Some("https://127.0.0.1:1"))
            .err()
            .unwrap();
        assert!(e.to_string().contains("ca.crt"), "{e}");
        std::fs::write(dir.path().join("ca.crt"), "not a certificate").unwrap();
        let e = Client::in_cluster(dir.path(), Some("https://127.0.0.1:1"))
            .err()
            .unwrap();
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
    }
}
