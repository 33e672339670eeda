use super::*;

fn req(json: &str) -> api::ValidateContainerAdjustmentRequest {
    protobuf_json_mapping::parse_from_str(json).unwrap_or_else(|e| panic!("{json}: {e}"))
}

fn on(cfg: DefaultValidatorConfig) -> DefaultValidator {
    DefaultValidator::new(DefaultValidatorConfig { enable: true, ..cfg })
}

const HOOKED: &str = r#"{"container": {"id": "c1", "name": "app"},
    "owners": {"owners": {"c1": {"simple": {"3": "10-a,20-b"}}}}}"#;

#[test]
fn defaults_reject_nothing() {
    let v = on(DefaultValidatorConfig::default());
    assert!(v.validate(&req(HOOKED)).is_ok());
}

#[test]
fn r18_oci_hooks_rejected_when_configured() {
    let v = on(DefaultValidatorConfig {
        reject_oci_hook_adjustment: true,
        ..Default::default()
    });
    let e = v.validate(&req(HOOKED)).unwrap_err();
    assert_eq!(
        e,
        r#"validation error: plugins "10-a,20-b" attempted restricted OCI hook injection"#
    );
}

#[test]
fn seccomp_rules_follow_the_pristine_profile() {
    let owned = |profile: &str| {
        req(&format!(
            r#"{{"container": {{"id": "c1", "linux": {{{profile}}}}},
               "owners": {{"owners": {{"c1": {{"simple": {{"32": "10-a"}}}}}}}}}}"#
        ))
    };
    let all = on(DefaultValidatorConfig {
        reject_runtime_default_seccomp_adjustment: true,
        reject_unconfined_seccomp_adjustment: true,
        reject_custom_seccomp_adjustment: true,
        ..Default::default()
    });
    assert!(all.validate(&owned("")).unwrap_err().contains("unconfined"));
    let rd = r#""seccompProfile": {"profileType": "RUNTIME_DEFAULT"}"#;
    assert!(all.validate(&owned(rd)).unwrap_err().contains("runtime default"));
    let lh = r#""seccompProfile": {"profileType": "LOCALHOST"}"#;
    assert!(all.validate(&owned(lh)).unwrap_err().contains("custom"));
    let only_custom = on(DefaultValidatorConfig {
        reject_custom_seccomp_adjustment: true,
        ..Default::default()
    });
    assert!(only_custom.validate(&owned(rd)).is_ok());
    assert!(only_custom.validate(&owned(lh)).is_err());
}

#[test]
fn namespace_and_sysctl_rules() {
    let r = req(
        r#"{"container": {"id": "c1"}, "adjust": {"linux": {"sysctl": {"net.x": "1"}}},
        "owners": {"owners": {"c1": {"compound": {"33": {"owners": {"net": "10-a"}}, "34": {"owners": {"net.x": "20-b"}}}}}}}"#,
    );
    let ns = on(DefaultValidatorConfig {
        reject_namespace_adjustment: true,
        ..Default::default()
    });
    assert_eq!(
        ns.validate(&r).unwrap_err(),
        r#"validation error: attempted restricted namespace adjustment by plugin(s) "10-a" (namespace "net")"#
    );
    let sys = on(DefaultValidatorConfig {
        reject_sysctl_adjustment: true,
        ..Default::default()
    });
    assert_eq!(
        sys.validate(&r).unwrap_err(),
        "validation error: attempted restricted sysctl adjustment by plugin(s) 20-b"
    );
}

#[test]
fn required_plugins_from_config_and_annotations() {
    let cfg = DefaultValidatorConfig {
        required_plugins: vec!["image-policy".into()],
        tolerate_missing_plugins_annotation: "tolerate-missing.example.com".into(),
        ..Default::default()
    };
    let v = on(cfg);
    let base = r#""container": {"id": "c1", "name": "app"}"#;
    let missing = req(&format!(
        r#"{{{base}, "plugins": [{{"name": "logger", "index": "05"}}]}}"#
    ));
    assert_eq!(
        v.validate(&missing).unwrap_err(),
        r#"validation error: required plugin "image-policy" not present"#
    );
    let present = req(&format!(
        r#"{{{base}, "plugins": [{{"name": "image-policy", "index": "10"}}]}}"#
    ));
    assert!(v.validate(&present).is_ok());
    // Annotation lookup: container-scoped wins over pod-scoped over bare.
    let annotated = req(&format!(
        r#"{{{base}, "plugins": [{{"name": "image-policy", "index": "10"}}],
           "pod": {{"annotations": {{
              "required-plugins.noderesource.dev/container.app": "[\"10-x\", y]",
              "required-plugins.noderesource.dev/pod": "[\"z\"]"}}}}}}"#
    ));
    assert_eq!(
        v.validate(&annotated).unwrap_err(),
        r#"validation error: required plugins "10-x,y" not present"#
    );
    let tolerated = req(&format!(
        r#"{{{base}, "pod": {{"annotations": {{"tolerate-missing.example.com": "true"}}}}}}"#
    ));
    assert!(v.validate(&tolerated).is_ok());
    let bad = req(&format!(
        r#"{{{base}, "pod": {{"annotations": {{"tolerate-missing.example.com": "maybe"}}}}}}"#
    ));
    assert!(v.validate(&bad).unwrap_err().contains("tolerate-missing.example.com"));
}

#[test]
fn name_lists() {
    assert_eq!(parse_name_list(r#"["a", "10-b"]"#).unwrap(), ["a", "10-b"]);
    assert_eq!(parse_name_list("[a, 'b']").unwrap(), ["a", "b"]);
    assert_eq!(parse_name_list("- a\n- b\n").unwrap(), ["a", "b"]);
    assert_eq!(parse_name_list("").unwrap(), Vec::<String>::new());
    assert!(parse_name_list("a: b").is_err());
    assert!(parse_name_list("{x}").is_err());
}
