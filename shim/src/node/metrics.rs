//! The optional Prometheus/OpenMetrics endpoint (`[metrics] address`):
//! per plugin and NRI request, invocations by outcome and a latency
//! histogram; per plugin, answers refused for a conflict, by a validator
//! or for a field outside the plugin's permissions; the plugins connected;
//! the daemon's tasks by state.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `nri_plugin_requests_total` | counter | `plugin`, `request`, `outcome` (`ok`, `error`, `timeout`) |
//! | `nri_plugin_request_duration_seconds` | histogram | `plugin`, `request` |
//! | `nri_plugin_rejections_total` | counter | `plugin`, `reason` (`conflict`, `validation`, `permission`) |
//! | `nri_plugins_connected` | gauge | |
//! | `nri_shim_tasks` | gauge | `state` (`created`, `starting`, `running`, `paused`, `stopped`) |
//!
//! The counters are fed by the adaptation's [`Observer`] on the request
//! path; the gauges are read when scraped. `GET /metrics` answers in the
//! OpenMetrics text format, which Prometheus reads; anything else is 404.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use nri_adaptation::{Observer, Outcome, Rejection};
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

use crate::{sync::lock, task::service::Status};

/// Latency buckets (seconds): from a builtin plugin's microseconds to the
/// longest request timeout one would configure.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A scrape's request head may not be longer (bytes).
const MAX_HEAD: usize = 8192;
/// A client that has not sent its request head by then is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    plugin: String,
    request: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    plugin: String,
    request: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectionLabels {
    plugin: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

type LatencyFamily = Family<LatencyLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// What the gauges are read from at scrape time.
pub struct Snapshot {
    /// Plugins registered with the adaptation.
    pub plugins: usize,
    /// Each live task's init status.
    pub tasks: Vec<Status>,
}

/// The daemon's metrics. Cheap to share: one per daemon, in an `Arc`.
pub struct Metrics {
    registry: Mutex<Registry>,
    requests: Family<RequestLabels, Counter>,
    latency: LatencyFamily,
    rejections: Family<RejectionLabels, Counter>,
    plugins: Gauge,
    tasks: Family<StateLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Every metric registered, all zero.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let latency: LatencyFamily = Family::new_with_constructor(latency_histogram);
        let rejections = Family::<RejectionLabels, Counter>::default();
        let plugins = Gauge::default();
        let tasks = Family::<StateLabels, Gauge>::default();
        registry.register(
            "nri_plugin_requests",
            "NRI requests sent to a plugin, by outcome",
            requests.clone(),
        );
        registry.register(
            "nri_plugin_request_duration_seconds",
            "Time a plugin took to answer an NRI request (or to fail it)",
            latency.clone(),
        );
        registry.register(
            "nri_plugin_rejections",
            "Plugin answers refused: conflicting with another plugin's, rejected by a validator, or outside the plugin's permissions",
            rejections.clone(),
        );
        registry.register("nri_plugins_connected", "NRI plugins registered", plugins.clone());
        registry.register("nri_shim_tasks", "Tasks of this shim daemon, by state", tasks.clone());
        Metrics {
            registry: Mutex::new(registry),
            requests,
            latency,
            rejections,
            plugins,
            tasks,
        }
    }

    /// The OpenMetrics text of every metric, the gauges set from `now`.
    pub fn render(&self, now: &Snapshot) -> String {
        self.plugins.set(now.plugins as i64);
        for state in Status::ALL {
            let n = now.tasks.iter().filter(|s| **s == state).count();
            self.tasks
                .get_or_create(&StateLabels {
                    state: state.name().into(),
                })
                .set(n as i64);
        }
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &lock(&self.registry));
        out
    }
}

impl Observer for Metrics {
    fn request(&self, plugin: &str, request: &'static str, elapsed: Duration, outcome: Outcome) {
        self.requests
            .get_or_create(&RequestLabels {
                plugin: plugin.into(),
                request: request.into(),
                outcome: outcome.as_str().into(),
            })
            .inc();
        self.latency
            .get_or_create(&LatencyLabels {
                plugin: plugin.into(),
                request: request.into(),
            })
            .observe(elapsed.as_secs_f64());
    }

    fn rejected(&self, plugin: &str, rejection: Rejection) {
        self.rejections
            .get_or_create(&RejectionLabels {
                plugin: plugin.into(),
                reason: rejection.as_str().into(),
            })
            .inc();
    }
}

/// Why the endpoint could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen for metrics scrapes on {address}")]
pub struct ListenError {
    /// The configured `[metrics] address`.
    pub address: SocketAddr,
    /// The bind error.
    #[source]
    pub source: std::io::Error,
}

/// Binds `address` and serves scrapes in a background task until the
/// runtime ends; `snapshot` is called once per scrape.
///
/// # Errors
/// [`ListenError`] when the address cannot be bound (in use, not local).
pub async fn serve(
    address: SocketAddr,
    metrics: Arc<Metrics>,
    snapshot: impl Fn() -> Snapshot + Send + Sync + 'static,
) -> Result<SocketAddr, ListenError> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|source| ListenError { address, source })?;
    let bound = listener.local_addr().unwrap_or(address);
    let snapshot = Arc::new(snapshot);
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (metrics, snapshot) = (metrics.clone(), snapshot.clone());
            tokio::spawn(async move {
                if let Err(e) = answer(stream, &metrics, &*snapshot).await {
                    tracing::debug!(error = %e, "metrics scrape failed");
                }
            });
        }
    });
    Ok(bound)
}

/// One scrape: reads the request head, answers, closes. HTTP/1.x without
/// keep-alive, which is all a Prometheus scrape needs.
async fn answer(
    mut stream: TcpStream,
    metrics: &Metrics,
    snapshot: &(dyn Fn() -> Snapshot + Send + Sync),
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let read = async {
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            if head.len() > MAX_HEAD {
                return Err(std::io::Error::other("request head too long"));
            }
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok(())
    };
    tokio::time::timeout(READ_TIMEOUT, read)
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|b| *b == b' ');
    let (method, target) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let path = target.split(|b| *b == b'?').next().unwrap_or_default();
    let (status, kind, body) = match (method, path) {
        (b"GET", b"/metrics") => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.render(&snapshot()),
        ),
        (b"GET", _) => ("404 Not Found", "text/plain", "not found: try /metrics\n".into()),
        _ => ("405 Method Not Allowed", "text/plain", "only GET\n".into()),
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_and_gauges_are_rendered() {
        let m = Metrics::new();
        m.request("10-a", "CreateContainer", Duration::from_millis(3), Outcome::Ok);
        m.request("10-a", "CreateContainer", Duration::from_millis(300), Outcome::Timeout);
        m.rejected("20-b", Rejection::Conflict);
        m.rejected("30-c", Rejection::Permission);
        let text = m.render(&Snapshot {
            plugins: 2,
            tasks: vec![Status::Running, Status::Running, Status::Created],
        });
        for line in [
            r#"nri_plugin_requests_total{plugin="10-a",request="CreateContainer",outcome="ok"} 1"#,
            r#"nri_plugin_requests_total{plugin="10-a",request="CreateContainer",outcome="timeout"} 1"#,
            r#"nri_plugin_request_duration_seconds_count{plugin="10-a",request="CreateContainer"} 2"#,
            r#"nri_plugin_request_duration_seconds_bucket{le="0.005",plugin="10-a",request="CreateContainer"} 1"#,
            r#"nri_plugin_rejections_total{plugin="20-b",reason="conflict"} 1"#,
            r#"nri_plugin_rejections_total{plugin="30-c",reason="permission"} 1"#,
            "nri_plugins_connected 2",
            r#"nri_shim_tasks{state="running"} 2"#,
            r#"nri_shim_tasks{state="created"} 1"#,
            r#"nri_shim_tasks{state="stopped"} 0"#,
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }

    #[tokio::test]
    async fn the_endpoint_answers_get_metrics_only() {
        let m = Arc::new(Metrics::new());
        let addr = serve("127.0.0.1:0".parse().unwrap(), m, || Snapshot {
            plugins: 1,
            tasks: Vec::new(),
        })
        .await
        .unwrap();
        let get = |req: &'static str| async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let ok = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(
            ok.contains("\r\n\r\n") && ok.contains("\nnri_plugins_connected 1\n"),
            "{ok}"
        );
        let body = ok.split_once("\r\n\r\n").unwrap().1;
        assert!(ok.contains(&format!("Content-Length: {}\r\n", body.len())), "{ok}");
        assert!(get("GET / HTTP/1.1\r\n\r\n").await.starts_with("HTTP/1.1 404"));
        assert!(get("POST /metrics HTTP/1.1\r\n\r\n").await.starts_with("HTTP/1.1 405"));
        // Taken addresses are named.
        let e = serve(addr, Arc::new(Metrics::new()), || Snapshot {
            plugins: 0,
            tasks: Vec::new(),
        })
        .await
        .unwrap_err();
        assert!(e.to_string().contains(&addr.to_string()), "{e}");
    }
}
