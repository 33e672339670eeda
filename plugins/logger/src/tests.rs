use nri_stub::{Plugin, api};

use super::*;

fn pod() -> api::PodSandbox {
    api::PodSandbox {
        id: "p1".into(),
        name: "web".into(),
        namespace: "default".into(),
        uid: "u1".into(),
        ..Default::default()
    }
}

fn ctr() -> api::Container {
    let mut c = api::Container {
        id: "c1".into(),
        name: "app".into(),
        env: vec!["A=1".into(), "B=2".into()],
        ..Default::default()
    };
    c.annotations.insert("k".into(), "v".into());
    let r = c.linux.mut_or_insert_default().resources.mut_or_insert_default();
    r.memory.mut_or_insert_default().limit.mut_or_insert_default().value = 1 << 20;
    r.pids.mut_or_insert_default().limit = 7;
    c
}

#[test]
fn json_always_has_event_pod_and_container() {
    let v: serde_json::Value = serde_json::to_value(Record::new("Shutdown")).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"event": "Shutdown", "pod": null, "container": null})
    );
    let v = serde_json::to_value(Record::pod("RunPodSandbox", &pod())).unwrap();
    assert_eq!(v["pod"]["namespace"], "default");
    assert!(v["container"].is_null());
}

#[test]
fn create_container_record_has_counts_and_resources() {
    let c = ctr();
    let r = Record::detailed("CreateContainer", &pod(), &c, c.linux.resources.as_ref().unwrap());
    assert_eq!((r.annotations, r.env), (Some(1), Some(2)));
    let res = r.resources.as_ref().unwrap();
    assert_eq!(res["memory.limit"], 1 << 20);
    assert_eq!(res["pids.limit"], 7);
    assert_eq!(
        r.text(),
        "CreateContainer pod=default/web (p1) container=app (c1) annotations=1 env=2 resources=[memory.limit=1048576 pids.limit=7]"
    );
    let back: Record = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back, r);
}

#[test]
fn resources_summary_keys_every_shape() {
    let mut r = api::LinuxResources::new();
    let m = r.memory.mut_or_insert_default();
    m.limit.mut_or_insert_default().value = 1;
    m.swappiness.mut_or_insert_default().value = 10;
    m.disable_oom_killer.mut_or_insert_default().value = true;
    let c = r.cpu.mut_or_insert_default();
    c.quota.mut_or_insert_default().value = -1;
    c.period.mut_or_insert_default().value = 1000;
    c.cpus = "0".into();
    r.hugepage_limits.push(api::HugepageLimit {
        page_size: "2MB".into(),
        limit: 4,
        ..Default::default()
    });
    r.unified.insert("io.max".into(), "x".into());
    r.blockio_class.mut_or_insert_default().value = "b".into();
    r.rdt_class.mut_or_insert_default().value = "r".into();
    r.pids.mut_or_insert_default().limit = 3;
    r.devices = vec![api::LinuxDeviceCgroup::new(), api::LinuxDeviceCgroup::new()];
    assert_eq!(
        serde_json::to_value(resources_summary(&r)).unwrap(),
        serde_json::json!({
            "memory.limit": 1, "memory.swappiness": 10, "memory.disable_oom_killer": true,
            "cpu.quota": -1, "cpu.period": 1000, "cpu.cpus": "0", "hugepages.2MB": 4,
            "unified.io.max": "x", "blockio_class": "b", "rdt_class": "r", "pids.limit": 3, "devices": 2,
        })
    );
}

#[test]
fn config_rejects_unknown_keys_and_events() {
    assert_eq!(LoggerConfig::parse("").unwrap(), LoggerConfig::default());
    let e = LoggerConfig::parse("log-file = \"/x\"").unwrap_err().to_string();
    assert!(e.contains("log-file"), "{e}");
    let e = LoggerConfig::parse("events = \"CreateContainer,bogus\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("bogus"), "{e}");
    let m = LoggerConfig::parse("events = \"pod\"").unwrap().event_mask().unwrap();
    assert_eq!(m, Some(EventMask::POD));
}

#[test]
fn a_toml_error_is_one_line_naming_the_line() {
    let e = LoggerConfig::parse("events = \"pod\"\ncolour = \"red\"\n")
        .unwrap_err()
        .to_string();
    assert!(!e.contains('\n'), "{e}");
    assert!(
        e.starts_with("invalid nri-logger configuration: line 2 `colour = \"red\"`: unknown field `colour`"),
        "{e}"
    );
    let e = LoggerConfig::parse("events = [").unwrap_err().to_string();
    assert!(!e.contains('\n') && e.contains("line 1"), "{e}");
}

#[tokio::test]
async fn configure_applies_the_runtime_config_and_writes_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let logger = Logger::new();
    let req = api::ConfigureRequest {
        config: format!("events = \"container\"\nlog_file = {:?}\n", path.display().to_string()),
        runtime_name: "rt".into(),
        runtime_version: "1".into(),
        ..Default::default()
    };
    let mask = logger.configure(&req).await.unwrap();
    assert_eq!(mask, EventMask::CONTAINER);
    logger.start_container(&pod(), &ctr()).await.unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<Record> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0].event, "Configure");
    assert_eq!(lines[0].runtime.as_deref(), Some("rt/1"));
    assert_eq!(lines[1].container.as_ref().unwrap().id, "c1");

    let bad = api::ConfigureRequest {
        config: "colour = 1".into(),
        ..Default::default()
    };
    let e = logger.configure(&bad).await.unwrap_err().to_string();
    assert!(e.contains("colour"), "{e}");
}
