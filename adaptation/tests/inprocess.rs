//! Runtime side and Rust stub in one process over a real unix socket.

use std::time::Duration;

use nri_adaptation::{Adaptation, RuntimeState, api};
use nri_stub::{BoxError, EventMask, Plugin, Stub};

struct AddEnv;

#[nri_stub::async_trait]
impl Plugin for AddEnv {
    async fn create_container(
        &self,
        _pod: &api::PodSandbox,
        _container: &api::Container,
    ) -> Result<api::CreateContainerResponse, BoxError> {
        let mut rsp = api::CreateContainerResponse::new();
        rsp.adjust.mut_or_insert_default().env.push(api::KeyValue {
            key: "HELLO".into(),
            value: "nri".into(),
            ..Default::default()
        });
        Ok(rsp)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stub_registers_and_adjusts() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nri/nri.sock");
    let nri = Adaptation::builder("test-runtime", "0.1")
        .with_sync_fn(|| async { Ok(RuntimeState::default()) })
        .with_update_fn(|_| async { Ok(Vec::new()) })
        .with_socket_path(&sock)
        .with_plugin_path(dir.path().join("none"))
        .build()
        .unwrap();
    nri.start().await.unwrap();
    let handle = Stub::builder(AddEnv)
        .with_plugin_name("add-env")
        .with_plugin_idx("10")
        .with_socket_path(&sock)
        .with_events(EventMask::parse("CreateContainer").unwrap())
        .build()
        .unwrap()
        .start()
        .await
        .unwrap();
    assert_eq!(handle.runtime().name, "test-runtime");
    for _ in 0..100 {
        if nri.plugin_names() == ["10-add-env"] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(nri.plugin_names(), ["10-add-env"]);
    let mut req = api::CreateContainerRequest::new();
    req.container.mut_or_insert_default().id = "c1".into();
    let rsp = nri.create_container(req).await.unwrap();
    assert_eq!(rsp.adjust.env[0].key, "HELLO");
    nri.stop().await;
    assert!(handle.wait().await.is_ok(), "Shutdown ends the plugin cleanly");
}
