//! The observer sees each plugin request with its outcome (ok, error,
//! timeout) and each answer refused for a conflict or by a validator,
//! attributed to the plugin, with builtin plugins.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use nri_adaptation::{Adaptation, EventMask, Observer, Outcome, Rejection, RuntimeState, api};
use nri_proto::plugin::{BoxError, Plugin};

#[derive(Default)]
struct Recorder {
    requests: Mutex<Vec<(String, &'static str, Outcome)>>,
    rejections: Mutex<Vec<(String, Rejection)>>,
}

impl Observer for Recorder {
    fn request(&self, plugin: &str, request: &'static str, _elapsed: Duration, outcome: Outcome) {
        self.requests.lock().unwrap().push((plugin.into(), request, outcome));
    }
    fn rejected(&self, plugin: &str, rejection: Rejection) {
        self.rejections.lock().unwrap().push((plugin.into(), rejection));
    }
}

/// Sets env FOO to its value; sleeps first if asked; fails if asked.
struct SetFoo {
    value: &'static str,
    sleep: Duration,
    fail: bool,
}

#[async_trait::async_trait]
impl Plugin for SetFoo {
    async fn create_container(
        &self,
        _pod: &api::PodSandbox,
        _container: &api::Container,
    ) -> Result<api::CreateContainerResponse, BoxError> {
        tokio::time::sleep(self.sleep).await;
        if self.fail {
            return Err("refusing on purpose".into());
        }
        let mut rsp = api::CreateContainerResponse::new();
        rsp.adjust.mut_or_insert_default().env.push(api::KeyValue {
            key: "FOO".into(),
            value: self.value.into(),
            ..Default::default()
        });
        Ok(rsp)
    }
}

struct RejectAll;

#[async_trait::async_trait]
impl Plugin for RejectAll {
    async fn validate_container_adjustment(
        &self,
        _req: &api::ValidateContainerAdjustmentRequest,
    ) -> Result<(), BoxError> {
        Err("nothing passes".into())
    }
}

fn foo(value: &'static str, sleep_ms: u64, fail: bool) -> Arc<dyn Plugin> {
    Arc::new(SetFoo {
        value,
        sleep: Duration::from_millis(sleep_ms),
        fail,
    })
}

async fn adaptation(recorder: &Arc<Recorder>, plugins: Vec<(&str, &str, EventMask, Arc<dyn Plugin>)>) -> Adaptation {
    let dir = tempfile::tempdir().unwrap();
    let mut b = Adaptation::builder("test-runtime", "0.1")
        .with_sync_fn(|| async { Ok(RuntimeState::default()) })
        .with_update_fn(|_| async { Ok(Vec::new()) })
        .with_disabled_connections()
        .with_plugin_path(dir.path().join("none"))
        .with_request_timeout(Duration::from_millis(200))
        .with_observer(recorder.clone());
    for (idx, name, events, p) in plugins {
        b = b.with_builtin_plugin(idx, name, events, p);
    }
    let nri = b.build().unwrap();
    nri.start().await.unwrap();
    nri
}

fn create_request() -> api::CreateContainerRequest {
    let mut req = api::CreateContainerRequest::new();
    req.container.mut_or_insert_default().id = "c1".into();
    req
}

fn requests_of(r: &Recorder, request: &str) -> Vec<(String, Outcome)> {
    r.requests
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, q, _)| *q == request)
        .map(|(p, _, o)| (p.clone(), *o))
        .collect()
}

#[tokio::test]
async fn requests_are_observed_with_their_outcome() {
    let r = Arc::new(Recorder::default());
    let create = EventMask::parse("CreateContainer").unwrap();
    let nri = adaptation(
        &r,
        vec![
            ("10", "fast", create, foo("1", 0, false)),
            ("20", "slow", create, foo("1", 1000, false)),
            ("30", "failing", create, foo("1", 0, true)),
        ],
    )
    .await;
    // Start configured and synchronized each of them.
    let configured: Vec<String> = requests_of(&r, "Configure").into_iter().map(|(p, _)| p).collect();
    assert_eq!(configured.len(), 3, "{configured:?}");
    assert!(configured.contains(&"20-slow".to_string()), "{configured:?}");
    assert_eq!(requests_of(&r, "Synchronize").len(), 3);
    // The failing plugin's own error fails the create (after the slow one
    // timed out and was left out by the default ignore policy).
    let e = nri.create_container(create_request()).await.unwrap_err();
    assert!(e.to_string().contains("30-failing"), "{e}");
    assert_eq!(
        requests_of(&r, "CreateContainer"),
        [
            ("10-fast".to_string(), Outcome::Ok),
            ("20-slow".to_string(), Outcome::Timeout),
            ("30-failing".to_string(), Outcome::Error),
        ]
    );
    assert!(r.rejections.lock().unwrap().is_empty());
    nri.stop().await;
}

#[tokio::test]
async fn conflicts_and_validation_rejections_are_observed_by_plugin() {
    let r = Arc::new(Recorder::default());
    let create = EventMask::parse("CreateContainer").unwrap();
    let nri = adaptation(
        &r,
        vec![
            ("10", "one", create, foo("1", 0, false)),
            ("20", "two", create, foo("2", 0, false)),
        ],
    )
    .await;
    let e = nri.create_container(create_request()).await.unwrap_err();
    assert!(matches!(e, nri_adaptation::Error::Merge(_)), "{e}");
    assert_eq!(
        *r.rejections.lock().unwrap(),
        [("20-two".to_string(), Rejection::Conflict)]
    );
    nri.stop().await;

    let r = Arc::new(Recorder::default());
    let nri = adaptation(
        &r,
        vec![
            ("10", "one", create, foo("1", 0, false)),
            (
                "90",
                "validator",
                EventMask::parse("ValidateContainerAdjustment").unwrap(),
                Arc::new(RejectAll),
            ),
        ],
    )
    .await;
    let e = nri.create_container(create_request()).await.unwrap_err();
    assert!(matches!(e, nri_adaptation::Error::Validation(_)), "{e}");
    assert_eq!(
        *r.rejections.lock().unwrap(),
        [("90-validator".to_string(), Rejection::Validation)]
    );
    assert_eq!(
        requests_of(&r, "ValidateContainerAdjustment"),
        [("90-validator".to_string(), Outcome::Ok)]
    );
    nri.stop().await;
}
