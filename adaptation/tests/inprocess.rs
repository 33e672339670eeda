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

struct Reject;

#[nri_stub::async_trait]
impl Plugin for Reject {
    async fn validate_container_adjustment(
        &self,
        req: &api::ValidateContainerAdjustmentRequest,
    ) -> Result<(), BoxError> {
        if req.adjust.env.iter().any(|e| e.key == "HELLO") {
            return Err("HELLO is not allowed here".into());
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builtin_plugins_adjust_and_validate_in_process() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let nri = Adaptation::builder("test-runtime", "0.1")
        .with_sync_fn(|| async { Ok(RuntimeState::default()) })
        .with_update_fn(|_| async { Ok(Vec::new()) })
        .with_disabled_connections()
        .with_plugin_path(dir.path().join("none"))
        .with_builtin_plugin(
            "10",
            "add-env",
            EventMask::parse("CreateContainer").unwrap(),
            Arc::new(AddEnv),
        )
        .build()
        .unwrap();
    nri.start().await.unwrap();
    assert_eq!(nri.plugin_names(), ["10-add-env"]);
    let mut req = api::CreateContainerRequest::new();
    req.container.mut_or_insert_default().id = "c1".into();
    let (rsp, report) = nri.create_container_with_report(req.clone()).await;
    let rsp = rsp.unwrap();
    assert_eq!(report.plugins.len(), 1, "{report:?}");
    assert_eq!(rsp.adjust.env[0].key, "HELLO");
    nri.stop().await;
    assert!(nri.plugin_names().is_empty());

    let nri = Adaptation::builder("test-runtime", "0.1")
        .with_sync_fn(|| async { Ok(RuntimeState::default()) })
        .with_update_fn(|_| async { Ok(Vec::new()) })
        .with_disabled_connections()
        .with_plugin_path(dir.path().join("none"))
        .with_builtin_plugin(
            "10",
            "add-env",
            EventMask::parse("CreateContainer").unwrap(),
            Arc::new(AddEnv),
        )
        .with_builtin_plugin("90", "reject", EventMask::parse("validate").unwrap(), Arc::new(Reject))
        .build()
        .unwrap();
    nri.start().await.unwrap();
    let e = nri.create_container(req).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"validator "90-reject" rejected container adjustment, reason: HELLO is not allowed here"#
    );
    nri.stop().await;
}

struct SlowValidator;

#[nri_stub::async_trait]
impl Plugin for SlowValidator {
    async fn validate_container_adjustment(
        &self,
        _req: &api::ValidateContainerAdjustmentRequest,
    ) -> Result<(), BoxError> {
        tokio::time::sleep(Duration::from_secs(5)).await;
        Ok(())
    }
}

/// A runtime can tell a rejection (about this container) from a validator
/// that gave no verdict (about the validator), and which validator it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_errors_say_which_validator_and_whether_it_rejected_or_failed() {
    use std::sync::Arc;

    use nri_adaptation::{DefaultValidatorConfig, Error, PluginError, ValidationError};
    let dir = tempfile::tempdir().unwrap();
    let build = |b: nri_adaptation::AdaptationBuilder| {
        b.with_sync_fn(|| async { Ok(RuntimeState::default()) })
            .with_update_fn(|_| async { Ok(Vec::new()) })
            .with_disabled_connections()
            .with_plugin_path(dir.path().join("none"))
            .with_request_timeout(Duration::from_millis(200))
            .build()
            .unwrap()
    };
    let mut req = api::CreateContainerRequest::new();
    req.container.mut_or_insert_default().id = "c1".into();

    let nri = build(Adaptation::builder("test-runtime", "0.1").with_builtin_plugin(
        "90",
        "slow",
        EventMask::parse("validate").unwrap(),
        Arc::new(SlowValidator),
    ));
    nri.start().await.unwrap();
    match nri.create_container(req.clone()).await {
        Err(Error::Validation(ValidationError::Failed {
            validator,
            source: PluginError::Timeout(_),
        })) => assert_eq!(validator, "90-slow"),
        other => panic!("expected a validator timeout, got {other:?}"),
    }
    // A validator without a verdict is dropped (failure policy ignore).
    assert!(nri.plugin_names().is_empty());
    nri.stop().await;

    let nri = build(
        Adaptation::builder("test-runtime", "0.1").with_default_validator(DefaultValidatorConfig {
            required_plugins: vec!["needed".into()],
            ..Default::default()
        }),
    );
    nri.start().await.unwrap();
    match nri.create_container(req).await {
        Err(Error::Validation(e @ ValidationError::Rejected { .. })) => {
            assert_eq!(e.validator(), "00-default-validator");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    nri.stop().await;
}

/// Sets a memory limit, adds a prestart hook and removes the env var
/// `DROP`: a simple field, an accumulating field and a removal.
struct Limits;

#[nri_stub::async_trait]
impl Plugin for Limits {
    async fn create_container(
        &self,
        _pod: &api::PodSandbox,
        _container: &api::Container,
    ) -> Result<api::CreateContainerResponse, BoxError> {
        let mut rsp = api::CreateContainerResponse::new();
        let adjust = rsp.adjust.mut_or_insert_default();
        adjust
            .linux
            .mut_or_insert_default()
            .resources
            .mut_or_insert_default()
            .memory
            .mut_or_insert_default()
            .limit = protobuf::MessageField::some(api::OptionalInt64 {
            value: 64 << 20,
            ..Default::default()
        });
        adjust.hooks.mut_or_insert_default().prestart.push(api::Hook {
            path: "/bin/true".into(),
            ..Default::default()
        });
        adjust.env.push(api::KeyValue {
            key: "-DROP".into(),
            ..Default::default()
        });
        Ok(rsp)
    }
}

/// Subscribed to CreateContainer, changes nothing.
struct Idle;

#[nri_stub::async_trait]
impl Plugin for Idle {}

/// The audit trail of a create: who set or removed which field, and which
/// plugins changed the container at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_report_says_which_plugin_changed_which_field() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let create = || EventMask::parse("CreateContainer").unwrap();
    let nri = Adaptation::builder("test-runtime", "0.1")
        .with_sync_fn(|| async { Ok(RuntimeState::default()) })
        .with_update_fn(|_| async { Ok(Vec::new()) })
        .with_disabled_connections()
        .with_plugin_path(dir.path().join("none"))
        .with_builtin_plugin("10", "add-env", create(), Arc::new(AddEnv))
        .with_builtin_plugin("20", "limits", create(), Arc::new(Limits))
        .with_builtin_plugin("30", "idle", create(), Arc::new(Idle))
        .build()
        .unwrap();
    nri.start().await.unwrap();
    let mut req = api::CreateContainerRequest::new();
    req.container.mut_or_insert_default().id = "c1".into();
    req.container.mut_or_insert_default().env = vec!["DROP=1".into()];
    let (rsp, report) = nri.create_container_with_report(req).await;
    rsp.unwrap();
    let lines: Vec<String> = report
        .changes("c1")
        .iter()
        .map(|c| {
            format!(
                "{} {} {}{}",
                c.field,
                c.key.as_deref().unwrap_or("-"),
                c.plugin,
                if c.removed { " removed" } else { "" }
            )
        })
        .collect();
    assert_eq!(
        lines,
        [
            "OciHooks - 20-limits",
            "Env DROP 20-limits removed",
            "Env HELLO 10-add-env",
            "MemLimit - 20-limits",
        ]
    );
    assert_eq!(report.changed_by("c1"), ["10-add-env", "20-limits"]);
    assert!(report.changes("other").is_empty());
    nri.stop().await;
}
