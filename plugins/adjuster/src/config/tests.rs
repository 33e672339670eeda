use nri_stub::api;

use super::{parse::valid_cpuset, *};

fn err(text: &str) -> String {
    Config::parse(text).unwrap_err().to_string()
}

const HEAD: &str = "[[rule]]\nname = \"r\"\n[rule.adjust]\n";

#[test]
fn full_rule_parses() {
    let cfg = Config::parse(
        r#"
        [[rule]]
        name = "everything"
        [rule.match]
        pod_name = "web-*"
        pod_namespace = "prod"
        container_name = "app"
        annotations = { "example.com/tier" = "gold" }
        [rule.adjust]
        env = { FOO = "1", OLD = "-" }
        annotations = { "a" = "b", "gone" = "-" }
        mounts = [{ destination = "/cache", source = "/var/cache/app", type = "bind", options = ["rbind", "ro"] }]
        devices = [{ path = "/dev/fuse", type = "c", major = 10, minor = 229, file_mode = 0o666, uid = 0, gid = 0 }]
        cpu = { shares = 512, quota = 20000, period = 100000, cpus = "0-1", mems = "0" }
        memory = { limit = "256Mi", reservation = 1048576, swap = -1, swappiness = 10, disable_oom_killer = false }
        pids = { limit = 100 }
        rlimits = [{ type = "RLIMIT_NOFILE", hard = 4096, soft = 1024 }]
        oom_score_adj = 500
        "#,
    )
    .unwrap();
    let r = &cfg.rules[0];
    assert_eq!(r.matcher.pod_name.as_ref().unwrap().as_str(), "web-*");
    assert_eq!(r.adjust.env["OLD"], "-");
    assert_eq!(r.adjust.devices[0].typ, DeviceType::Char);
    assert_eq!(r.adjust.devices[0].file_mode, Some(0o666));
    let m = r.adjust.memory.as_ref().unwrap();
    assert_eq!(m.limit, Some(Bytes(256 << 20)));
    assert_eq!(m.swap, Some(Bytes(-1)));
    assert_eq!(r.adjust.rlimits[0].soft, 1024);
    assert_eq!(r.adjust.oom_score_adj, Some(500));
}

#[test]
fn empty_config_has_no_rules() {
    assert!(Config::parse("").unwrap().rules.is_empty());
}

#[test]
fn unknown_keys_are_named() {
    let e = err(&format!("{HEAD}colour = \"red\"\n"));
    assert!(e.contains("colour") && e.contains("rule 1"), "{e}");
    let e = err("[[rule]]\n[rule.match]\ncontainer = \"app\"\n[rule.adjust]\nenv = { A = \"1\" }\n");
    assert!(e.contains("unknown field `container`"), "{e}");
    let e = err(&format!("{HEAD}memory = {{ limt = 1 }}\n"));
    assert!(e.contains("limt"), "{e}");
    let e = err("rules = []\n");
    assert!(e.contains("rules"), "{e}");
    // The rule number is found for errors in later rules too.
    let e = err(&format!("{HEAD}env = {{ A = \"1\" }}\n{HEAD}pids = {{ max = 3 }}\n"));
    assert!(e.contains("rule 2") && e.contains("max"), "{e}");
}

#[test]
fn bad_values_are_named() {
    for (text, needle) in [
        (
            "[[rule]]\n[rule.match]\npod_name = \"web-?\"\n[rule.adjust]\noom_score_adj = 1\n",
            "web-?",
        ),
        (
            "[[rule]]\n[rule.match]\npod_name = \"\"\n[rule.adjust]\noom_score_adj = 1\n",
            "empty pattern",
        ),
        (&format!("{HEAD}memory = {{ limit = \"12MB\" }}\n"), "12MB"),
        (&format!("{HEAD}memory = {{ limit = -5 }}\n"), "-5"),
        (&format!("{HEAD}cpu = {{ shares = -1 }}\n"), "shares"),
        (
            &format!("{HEAD}devices = [{{ path = \"/dev/x\", type = \"x\", major = 1, minor = 1 }}]\n"),
            "`x`",
        ),
        (&format!("{HEAD}env = {{ A = 1 }}\n"), "expected a string"),
    ] {
        let e = err(text);
        assert!(e.contains(needle), "{needle:?} not in {e}");
    }
}

#[test]
fn semantic_errors_name_rule_and_key() {
    for (adjust, key) in [
        ("", "adjust: nothing to adjust"),
        ("env = { \"A=B\" = \"1\" }", "adjust.env.A=B"),
        ("env = { \"-A\" = \"1\" }", "adjust.env.-A"),
        ("annotations = { \"-a\" = \"1\" }", "adjust.annotations.-a"),
        ("mounts = [{ destination = \"rel\" }]", "adjust.mounts[0].destination"),
        (
            "mounts = [{ destination = \"/a\" }, { destination = \"/a\" }]",
            "adjust.mounts[1].destination",
        ),
        (
            "devices = [{ path = \"/dev/x\", type = \"c\", major = 1 }]",
            "adjust.devices[0].minor",
        ),
        (
            "devices = [{ path = \"/dev/x\", type = \"p\", file_mode = 0o17777 }]",
            "adjust.devices[0].file_mode",
        ),
        ("cpu = { period = 10 }", "adjust.cpu.period"),
        ("cpu = { quota = -2 }", "adjust.cpu.quota"),
        ("cpu = { cpus = \"3-1\" }", "adjust.cpu.cpus"),
        ("cpu = { mems = \"0,,1\" }", "adjust.cpu.mems"),
        ("memory = { swappiness = 101 }", "adjust.memory.swappiness"),
        ("pids = { limit = -2 }", "adjust.pids.limit"),
        (
            "rlimits = [{ type = \"NOFILE\", hard = 1, soft = 1 }]",
            "adjust.rlimits[0].type",
        ),
        (
            "rlimits = [{ type = \"RLIMIT_NOFILE\", hard = 1, soft = 2 }]",
            "adjust.rlimits[0].soft",
        ),
        ("oom_score_adj = 1001", "adjust.oom_score_adj"),
    ] {
        let e = err(&format!("{HEAD}{adjust}\n"));
        assert!(e.contains("rule 1 (\"r\")") && e.contains(key), "{key:?} not in {e}");
    }
}

#[test]
fn zero_memory_limit_is_refused_naming_rule_and_key() {
    for limit in ["0", "\"0\"", "\"0Mi\""] {
        let e = err(&format!("{HEAD}memory = {{ limit = {limit} }}\n"));
        assert!(
            e.contains("rule 1 (\"r\")") && e.contains("adjust.memory.limit") && e.contains("-1 (unlimited)"),
            "{limit}: {e}"
        );
    }
    // Zero swap is "no limit" to the runtime as well.
    let e = err(&format!("{HEAD}memory = {{ swap = 0 }}\n"));
    assert!(e.contains("rule 1 (\"r\")") && e.contains("adjust.memory.swap"), "{e}");
    // Unlimited and positive limits stay valid.
    for limit in ["-1", "1", "\"128Mi\""] {
        Config::parse(&format!("{HEAD}memory = {{ limit = {limit} }}\n")).unwrap();
    }
}

#[test]
fn swap_below_the_limit_is_refused_naming_both_values() {
    let e = err(&format!("{HEAD}memory = {{ limit = \"128Mi\", swap = \"64Mi\" }}\n"));
    assert!(
        e.contains("rule 1 (\"r\")")
            && e.contains("adjust.memory.swap")
            && e.contains("67108864 (64Mi)")
            && e.contains("134217728 (128Mi)"),
        "{e}"
    );
    // A finite memory+swap limit under an unlimited memory limit.
    let e = err(&format!("{HEAD}memory = {{ limit = -1, swap = 1000 }}\n"));
    assert!(
        e.contains("adjust.memory.swap") && e.contains("1000 (1k)") && e.contains("-1 (unlimited)"),
        "{e}"
    );
    for ok in [
        "limit = \"128Mi\", swap = \"128Mi\"",
        "limit = \"128Mi\", swap = \"256Mi\"",
        "limit = \"128Mi\", swap = -1",
        "limit = -1, swap = -1",
        "swap = \"64Mi\"",
    ] {
        Config::parse(&format!("{HEAD}memory = {{ {ok} }}\n")).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
}

#[test]
fn cpusets() {
    for ok in ["0", "0-3", "0-3,6", "1,2,3", "5-5"] {
        assert!(valid_cpuset(ok), "{ok}");
    }
    for bad in ["", "a", "3-1", "0,", "-1", "0-", "1 ,2"] {
        assert!(!valid_cpuset(bad), "{bad}");
    }
}

fn pod(name: &str, ns: &str, ann: &[(&str, &str)]) -> api::PodSandbox {
    let mut p = api::PodSandbox {
        id: "p1".into(),
        name: name.into(),
        namespace: ns.into(),
        ..Default::default()
    };
    for (k, v) in ann {
        p.annotations.insert(k.to_string(), v.to_string());
    }
    p
}

fn ctr(name: &str, ann: &[(&str, &str)]) -> api::Container {
    let mut c = api::Container {
        id: "c1".into(),
        name: name.into(),
        ..Default::default()
    };
    for (k, v) in ann {
        c.annotations.insert(k.to_string(), v.to_string());
    }
    c
}

#[test]
fn matching_requires_every_condition() {
    let cfg = Config::parse(
        r#"
        [[rule]]
        [rule.match]
        pod_name = "web-*"
        pod_namespace = "prod"
        container_name = "app"
        annotations = { "tier" = "gold", "team" = "a" }
        [rule.adjust]
        oom_score_adj = 1
        "#,
    )
    .unwrap();
    let r = &cfg.rules[0];
    let ann_pod = [("tier", "gold")];
    let ann_ctr = [("team", "a")];
    assert!(r.matches(&pod("web-1", "prod", &ann_pod), &ctr("app", &ann_ctr)));
    // Both annotations on the container also match.
    assert!(r.matches(
        &pod("web-1", "prod", &[]),
        &ctr("app", &[("tier", "gold"), ("team", "a")])
    ));
    // A pod value that differs does not hide a matching container value.
    assert!(r.matches(
        &pod("web-1", "prod", &[("tier", "silver")]),
        &ctr("app", &[("tier", "gold"), ("team", "a")])
    ));
    assert!(!r.matches(&pod("api-1", "prod", &ann_pod), &ctr("app", &ann_ctr)));
    assert!(!r.matches(&pod("web-1", "dev", &ann_pod), &ctr("app", &ann_ctr)));
    assert!(!r.matches(&pod("web-1", "prod", &ann_pod), &ctr("app2", &ann_ctr)));
    assert!(!r.matches(&pod("web-1", "prod", &ann_pod), &ctr("app", &[])));
    assert!(!r.matches(&pod("web-1", "prod", &[("tier", "silver")]), &ctr("app", &ann_ctr)));
}

#[test]
fn empty_match_matches_everything() {
    let cfg = Config::parse(&format!("{HEAD}oom_score_adj = 1\n")).unwrap();
    assert_eq!(cfg.matching(&pod("x", "y", &[]), &ctr("z", &[])).len(), 1);
}
