//! The adjuster plugin's rules file ([`nri_adjuster::Config::parse`]) and
//! what it makes of a valid one: the rules matching a container, their
//! merged response, and that response through the runtime's merge and
//! `adjust`.
//!
//! Properties: no panic on any text; every rule of a valid file yields a
//! response the runtime's merge accepts from a single plugin, and whose
//! adjustment the runtime applies to the busybox spec (the adjuster's own
//! validation refuses what the runtime would refuse, so a valid file never
//! makes creates fail).

use nri_adaptation::{CreateResult, adjust};
use nri_adjuster::{Config, Merged, api, response_for};
use protobuf::MessageField;

/// Runs one input; panics when a property fails.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let cfg = match Config::parse(text) {
        Ok(cfg) => cfg,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let pod = api::PodSandbox {
        id: "pod0".into(),
        name: "web".into(),
        namespace: "default".into(),
        annotations: [("team".to_string(), "blue".to_string())].into(),
        ..Default::default()
    };
    let mut container = nri_adaptation::convert::container_from_spec("c0", "pod0", "app", &crate::busybox_spec());
    container.annotations.insert("tier".into(), "front".into());
    let _ = response_for(&cfg, &pod, &container);
    for (n, rule) in cfg.rules.iter().enumerate() {
        let mut merged = Merged::new();
        merged.add(&rule.adjust);
        let rsp = merged.to_response();
        let mut result = CreateResult::new(api::CreateContainerRequest {
            pod: MessageField::some(pod.clone()),
            container: MessageField::some(container.clone()),
            ..Default::default()
        });
        result
            .apply("10-adjuster", rsp)
            .unwrap_or_else(|e| panic!("rule {} of a valid file does not merge: {e}", rule.label(n + 1)));
        let rsp = result.into_response();
        let mut spec = crate::busybox_spec();
        adjust(&mut spec, rsp.adjust.get_or_default())
            .unwrap_or_else(|e| panic!("rule {} of a valid file does not apply: {e}", rule.label(n + 1)));
    }
}
