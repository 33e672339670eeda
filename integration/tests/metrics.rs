//! The `[metrics]` endpoint of a real shim daemon under Debian's
//! containerd, scraped over TCP: plugin requests by plugin, request and
//! outcome, their latency, the plugins connected and the tasks by state.
//! Root only.

use std::time::{Duration, Instant};

use integration::{
    Behaviour,
    containerd::{Containerd, Setup, workspace_bin},
    free_port, try_scrape as scrape,
};

/// The value of the sample line `name{labels}` (exact label text).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn a_scrape_shows_plugin_requests_outcomes_latency_plugins_and_tasks() {
    // A port free now (the daemon binds it a moment later).
    let port = free_port();
    let shim_toml = format!("[metrics]\naddress = \"127.0.0.1:{port}\"\n");
    let env = serde_json::to_string(&Behaviour {
        events: Some("CreateContainer,StartContainer".into()),
        adjust: Some(serde_json::json!({"env": [{"key": "FROM_PLUGIN", "value": "1"}]})),
        ..Default::default()
    })
    .unwrap();
    let failing = serde_json::to_string(&Behaviour {
        events: Some("CreateContainer".into()),
        fail: [("CreateContainer".to_string(), "refused on purpose".to_string())].into(),
        only_container: Some("ctrd-m-bad".into()),
        ..Default::default()
    })
    .unwrap();
    let c = Containerd::start(Setup {
        plugins: vec![
            ("10-env", workspace_bin("nri-test-plugin"), env),
            ("20-fail", workspace_bin("nri-test-plugin"), failing),
        ],
        shim_toml: &shim_toml,
        idle_timeout: "60s",
        ..Default::default()
    });

    let out = c.run("ctrd-m-run", &["-d"], &["/bin/sleep", "300"]);
    assert!(out.status.success(), "{out:?}\n{}", c.shim_log());
    c.wait_status("ctrd-m-run", "RUNNING");
    let bad = c.run("ctrd-m-bad", &["--rm"], &["/bin/true"]);
    assert!(!bad.status.success(), "{bad:?}");

    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        match scrape(port) {
            Ok(t) => break t,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "no metrics endpoint on {port}: {e}\n{}",
                    c.shim_log()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("Content-Type: application/openmetrics-text"), "{text}");
    let ok = |plugin: &str, request: &str| {
        sample(
            &text,
            &format!(r#"nri_plugin_requests_total{{plugin="{plugin}",request="{request}",outcome="ok"}}"#),
        )
    };
    // Both containers reached 10-env's CreateContainer; only the first started.
    assert_eq!(ok("10-env", "CreateContainer"), Some(2.0), "{text}");
    assert_eq!(ok("10-env", "StartContainer"), Some(1.0), "{text}");
    assert_eq!(ok("10-env", "Configure"), Some(1.0), "{text}");
    assert_eq!(ok("20-fail", "CreateContainer"), Some(1.0), "{text}");
    assert_eq!(
        sample(
            &text,
            r#"nri_plugin_requests_total{plugin="20-fail",request="CreateContainer",outcome="error"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"nri_plugin_request_duration_seconds_count{plugin="10-env",request="CreateContainer"}"#
        ),
        Some(2.0),
        "{text}"
    );
    let sum = sample(
        &text,
        r#"nri_plugin_request_duration_seconds_sum{plugin="10-env",request="CreateContainer"}"#,
    )
    .unwrap();
    assert!(sum > 0.0 && sum < 4.0, "latency sum {sum}\n{text}");
    assert_eq!(sample(&text, "nri_plugins_connected"), Some(2.0), "{text}");
    assert_eq!(sample(&text, r#"nri_shim_tasks{state="running"}"#), Some(1.0), "{text}");
    assert_eq!(sample(&text, r#"nri_shim_tasks{state="created"}"#), Some(0.0), "{text}");
    assert!(text.trim_end().ends_with("# EOF"), "{text}");

    let _ = c.ctr(&["t", "kill", "-s", "KILL", "ctrd-m-run"]);
    c.wait_status("ctrd-m-run", "STOPPED");
    let text = scrape(port).unwrap();
    assert_eq!(sample(&text, r#"nri_shim_tasks{state="stopped"}"#), Some(1.0), "{text}");
    assert_eq!(sample(&text, r#"nri_shim_tasks{state="running"}"#), Some(0.0), "{text}");
    let _ = c.ctr(&["t", "rm", "ctrd-m-run"]);
    let _ = c.ctr(&["c", "rm", "ctrd-m-run"]);
}
