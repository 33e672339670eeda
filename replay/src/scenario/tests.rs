use super::*;

const PODS: &str = r#""pods": [{"id": "p1", "name": "web"}]"#;
const CONTAINERS: &str = r#""containers": [{"id": "c1", "pod": "p1", "container": {}}]"#;

fn load_str(json: &str) -> Result<Loaded, ScenarioError> {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("s.json");
    std::fs::write(&f, json).unwrap();
    load(&f)
}

fn load_err(json: &str) -> String {
    match load_str(json) {
        Ok(_) => panic!("accepted: {json}"),
        Err(e) => e.to_string(),
    }
}

/// A scenario with the pod p1 and container c1 and these steps.
fn with_steps(steps: &str) -> String {
    format!("{{{PODS}, {CONTAINERS}, \"steps\": [{steps}]}}")
}

#[test]
fn example_scenarios_load_with_their_payloads_parsed() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/scenarios");
    for f in ["basic.json", "conflict.json"] {
        load(&dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    }
    let l = load(&dir.join("basic.json")).unwrap();
    let shares = l.steps.iter().find_map(|s| match s {
        Step::UpdateContainer { resources, .. } => Some(resources.cpu.shares.value),
        _ => None,
    });
    assert_eq!(shares, Some(512));
}

#[test]
fn duplicate_ids_are_refused_naming_the_id_and_the_list() {
    let e = load_err(r#"{"pods": [{"id": "p1"}, {"id": "p2"}, {"id": "p1"}], "containers": [], "steps": []}"#);
    assert!(
        e.contains("pods[2]") && e.contains("duplicate pod id \"p1\"") && e.contains("pods[0]"),
        "{e}"
    );
    let e = load_err(&format!(
        r#"{{{PODS}, "containers": [{{"id": "c1", "pod": "p1", "container": {{}}}},
                                    {{"id": "c1", "pod": "p1", "container": {{}}}}], "steps": []}}"#
    ));
    assert!(
        e.contains("containers[1]") && e.contains("duplicate container id \"c1\"") && e.contains("containers[0]"),
        "{e}"
    );
}

#[test]
fn empty_ids_are_refused_naming_the_entry() {
    let e = load_err(r#"{"pods": [{"id": "p1"}, {"name": "web"}], "steps": []}"#);
    assert!(e.ends_with("pods[1]: empty id"), "{e}");
    let e = load_err(&format!(
        r#"{{{PODS}, "containers": [{{"id": "c1", "pod": "p1", "container": {{}}}},
                                    {{"id": "c2", "pod": "p1", "container": {{}}}},
                                    {{"id": "", "pod": "p1", "container": {{}}}}], "steps": []}}"#
    ));
    assert!(e.ends_with("containers[2]: empty id"), "{e}");
    let e = load_err(&format!(
        r#"{{{PODS}, "containers": [{{"id": "c1", "pod": "", "container": {{}}}}], "steps": []}}"#
    ));
    assert!(e.contains("containers[0]") && e.contains("unknown pod \"\""), "{e}");
}

#[test]
fn step_payloads_are_parsed_when_the_scenario_is_loaded() {
    let e = load_err(&with_steps(
        r#"{"run_pod_sandbox": "p1"}, {"create_container": "c1"},
           {"update_container": {"container": "c1", "resources": {"cpu": {"shares": "lots"}}}}"#,
    ));
    assert!(
        e.contains("steps[2] (update_container): resources") && e.contains("lots"),
        "{e}"
    );
    let e = load_err(&with_steps(
        r#"{"run_pod_sandbox": "p1"},
           {"update_pod_sandbox": {"pod": "p1", "overhead": {"memory": {"colour": 1}}}}"#,
    ));
    assert!(
        e.contains("steps[1] (update_pod_sandbox)") && e.contains("overhead") && e.contains("colour"),
        "{e}"
    );
    let e = load_err(&with_steps(r#"{"update_container": {"container": "c1"}}"#));
    assert!(
        e.contains("steps[0] (update_container)") && e.contains("resources"),
        "{e}"
    );
    let e = load_err(&with_steps(
        r#"{"update_container": {"container": "c1", "resources": {}, "extra": 1}}"#,
    ));
    assert!(e.contains("steps[0] (update_container)") && e.contains("extra"), "{e}");
}

#[test]
fn unknown_step_targets_name_the_step() {
    let e = load_err(&with_steps(
        r#"{"run_pod_sandbox": "p1"}, {"create_container": "c1"}, {"start_container": "c1"},
           {"start_container": "x"}"#,
    ));
    assert!(
        e.ends_with(r#"steps[3] (start_container): unknown container "x""#),
        "{e}"
    );
    let e = load_err(&with_steps(r#"{"update_pod_sandbox": {"pod": "q"}}"#));
    assert!(e.ends_with(r#"steps[0] (update_pod_sandbox): unknown pod "q""#), "{e}");
    // A pod id is not a container id.
    let e = load_err(&with_steps(r#"{"stop_container": "p1"}"#));
    assert!(
        e.ends_with(r#"steps[0] (stop_container): unknown container "p1""#),
        "{e}"
    );
}

#[test]
fn a_step_has_exactly_one_key() {
    let e = load_err(&with_steps(
        r#"{"run_pod_sandbox": "p1"}, {"start_container": "c1", "stop_container": "c1"}"#,
    ));
    assert!(
        e.contains("steps[1]")
            && e.contains("exactly one key")
            && e.contains("start_container")
            && e.contains("stop_container"),
        "{e}"
    );
    for (step, needle) in [
        ("{}", "exactly one key"),
        (r#""run_pod_sandbox""#, "exactly one key"),
        (r#"{"launch_container": "c1"}"#, "launch_container"),
    ] {
        let e = load_err(&with_steps(step));
        assert!(e.contains("steps[0]") && e.contains(needle), "{step}: {e}");
    }
}

#[test]
fn steps_in_any_lifecycle_order_are_accepted() {
    // Plugin authors replay orders a runtime would not send.
    let l = load_str(&with_steps(
        r#"{"remove_container": "c1"}, {"start_container": "c1"}, {"create_container": "c1"},
           {"create_container": "c1"}, {"stop_pod_sandbox": "p1"}, {"run_pod_sandbox": "p1"}"#,
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(l.steps.len(), 6);
}

#[test]
fn a_config_json_container_is_named_after_the_scenario_not_the_fixture() {
    // busybox.json says container "app" in pod "web" (p1, namespace default).
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/oci/busybox.json");
    let json = format!(
        r#"{{"pods": [{{"id": "p9", "name": "db", "namespace": "prod", "uid": "u9"}}],
            "containers": [{{"id": "c9", "pod": "p9", "name": "sql", "config": {:?}}}],
            "steps": [{{"create_container": "c9"}}]}}"#,
        fixture.display().to_string()
    );
    let l = load_str(&json).unwrap();
    let (ctr, spec) = &l.containers["c9"];
    let want = [
        ("io.kubernetes.cri.container-name", "sql"),
        ("io.kubernetes.cri.sandbox-id", "p9"),
        ("io.kubernetes.cri.sandbox-name", "db"),
        ("io.kubernetes.cri.sandbox-namespace", "prod"),
        // Not a key of the fixture: not added.
        ("io.kubernetes.cri.container-type", "container"),
    ];
    let spec_annotations = spec.as_ref().unwrap().annotations().clone().unwrap();
    for (k, v) in want {
        assert_eq!(ctr.annotations.get(k).map(String::as_str), Some(v), "container {k}");
        assert_eq!(spec_annotations.get(k).map(String::as_str), Some(v), "spec {k}");
    }
    assert!(!ctr.annotations.contains_key("io.kubernetes.cri.sandbox-uid"));
    assert_eq!((ctr.name.as_str(), ctr.pod_sandbox_id.as_str()), ("sql", "p9"));
}
