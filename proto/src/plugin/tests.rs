//! The adapter's own behaviour: which events are notifications, the hooks,
//! rejection by error, split sync.

use super::*;
use std::sync::{Arc, Mutex};

#[test]
fn notifications_are_the_events_without_reply_content() {
    let with_reply = [
        Event::UPDATE_POD_SANDBOX,
        Event::CREATE_CONTAINER,
        Event::UPDATE_CONTAINER,
        Event::STOP_CONTAINER,
        Event::VALIDATE_CONTAINER_ADJUSTMENT,
    ];
    for e in crate::events::ALL_EVENTS {
        assert_eq!(NOTIFICATIONS.is_set(e), !with_reply.contains(&e), "{e:?}");
    }
}

struct Refuses;

#[async_trait]
impl Plugin for Refuses {
    async fn configure(&self, _req: &api::ConfigureRequest) -> Result<EventMask, BoxError> {
        Err("no config".into())
    }
    async fn validate_container_adjustment(
        &self,
        _req: &api::ValidateContainerAdjustmentRequest,
    ) -> Result<(), BoxError> {
        Err("too much".into())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn hooks_see_configure_and_shutdown_and_a_validation_error_is_a_rejection() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let seen = Arc::new(Mutex::new(None));
    let down = Arc::new(AtomicBool::new(false));
    let (s, d) = (seen.clone(), down.clone());
    let adapter = PluginAdapter::new(Arc::new(Refuses), EventMask::VALID)
        .with_configure_hook(move |_, r| *s.lock().unwrap() = Some(r.map_err(|e| e.to_string())))
        .with_shutdown_hook(move || d.store(true, Ordering::SeqCst));
    assert!(adapter.configure(&api::ConfigureRequest::new()).await.is_err());
    assert_eq!(*seen.lock().unwrap(), Some(Err("no config".to_string())));
    let v = adapter
        .validate_container_adjustment(&api::ValidateContainerAdjustmentRequest::new())
        .await;
    assert!(v.reject);
    assert_eq!(v.reason, "too much");
    adapter.shutdown().await;
    assert!(down.load(Ordering::SeqCst));
}

#[tokio::test(flavor = "current_thread")]
async fn a_split_sync_reaches_the_plugin_once() {
    struct Count(Mutex<Vec<usize>>);
    #[async_trait]
    impl Plugin for Count {
        async fn synchronize(
            &self,
            pods: &[api::PodSandbox],
            _containers: &[api::Container],
        ) -> Result<Vec<api::ContainerUpdate>, BoxError> {
            self.0.lock().unwrap().push(pods.len());
            Ok(Vec::new())
        }
    }
    let plugin = Arc::new(Count(Mutex::new(Vec::new())));
    let adapter = PluginAdapter::new(plugin.clone(), EventMask::VALID);
    let part = |more| api::SynchronizeRequest {
        pods: vec![api::PodSandbox::new()],
        more,
        ..Default::default()
    };
    assert!(adapter.synchronize(part(true)).await.unwrap().more);
    assert!(!adapter.synchronize(part(false)).await.unwrap().more);
    assert_eq!(*plugin.0.lock().unwrap(), [2]);
}
