//! The order in which plugins get requests, without one lock across a
//! request's plugin chain: creates run side by side (each plugin serving
//! one request at a time, in the order they were admitted), yet merge,
//! ownership and errors are those of calling the plugins one after another,
//! and the StopContainer and RemoveContainer a runtime sends for a failed
//! create reach every plugin after that create.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use nri_adaptation::{Adaptation, Error, PluginView, RuntimeState, api};
use nri_stub::{BoxError, EventMask, Plugin};
use proptest::prelude::*;
use tokio::sync::Notify;

/// What a scripted plugin answers to one container's CreateContainer.
#[derive(Debug, Clone)]
enum Answer {
    Nothing,
    /// Sets this environment variable to the plugin's name.
    Env(&'static str),
    /// Sets this annotation to the plugin's name.
    Annotation(&'static str),
    /// Sets the memory limit.
    Memory(i64),
    /// Fails with its own error.
    Fail,
}

type Log = Arc<Mutex<Vec<(&'static str, String)>>>;

/// A builtin plugin answering from a script, after a delay, logging every
/// request it gets; `hold` makes its CreateContainer of one container wait
/// until released.
struct Scripted {
    me: String,
    answers: HashMap<String, (u64, Answer)>,
    log: Log,
    hold: Option<(String, Arc<Notify>)>,
}

#[nri_stub::async_trait]
impl Plugin for Scripted {
    async fn create_container(
        &self,
        _pod: &api::PodSandbox,
        c: &api::Container,
    ) -> Result<api::CreateContainerResponse, BoxError> {
        self.log.lock().unwrap().push(("create", c.id.clone()));
        if let Some((id, gate)) = &self.hold
            && *id == c.id
        {
            gate.notified().await;
        }
        let (delay, answer) = self.answers.get(&c.id).cloned().unwrap_or((0, Answer::Nothing));
        if delay > 0 {
            tokio::time::sleep(Duration::from_micros(delay)).await;
        }
        let mut rsp = api::CreateContainerResponse::new();
        let adjust = rsp.adjust.mut_or_insert_default();
        match answer {
            Answer::Nothing => {}
            Answer::Env(k) => adjust.env.push(api::KeyValue {
                key: k.into(),
                value: self.me.clone(),
                ..Default::default()
            }),
            Answer::Annotation(k) => {
                adjust.annotations.insert(k.into(), self.me.clone());
            }
            Answer::Memory(v) => {
                let mem = adjust
                    .linux
                    .mut_or_insert_default()
                    .resources
                    .mut_or_insert_default()
                    .memory
                    .mut_or_insert_default();
                mem.limit = Some(api::OptionalInt64 {
                    value: v,
                    ..Default::default()
                })
                .into();
            }
            Answer::Fail => return Err(format!("{} refuses {}", self.me, c.id).into()),
        }
        Ok(rsp)
    }

    async fn start_container(&self, _pod: &api::PodSandbox, c: &api::Container) -> Result<(), BoxError> {
        self.log.lock().unwrap().push(("start", c.id.clone()));
        Ok(())
    }

    async fn stop_container(
        &self,
        _pod: &api::PodSandbox,
        c: &api::Container,
    ) -> Result<Vec<api::ContainerUpdate>, BoxError> {
        self.log.lock().unwrap().push(("stop", c.id.clone()));
        Ok(Vec::new())
    }

    async fn remove_container(&self, _pod: &api::PodSandbox, c: &api::Container) -> Result<(), BoxError> {
        self.log.lock().unwrap().push(("remove", c.id.clone()));
        Ok(())
    }
}

/// One plugin of a scenario.
#[derive(Debug, Clone)]
struct PluginScript {
    original_view: bool,
    /// Per container: delay in µs and answer.
    answers: Vec<(u64, Answer)>,
}

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("c{i}")).collect()
}

/// An adaptation with the scripted plugins `10-p0`, `11-p1`, ...;
/// `timed`: with the scripts' delays and views, else none of either (the
/// reference, called one create at a time).
fn adaptation(
    dir: &std::path::Path,
    plugins: &[PluginScript],
    containers: usize,
    timed: bool,
) -> (Adaptation, Vec<Log>) {
    let mut b = Adaptation::builder("ordering-test", "0")
        .with_sync_fn(|| async { Ok(RuntimeState::default()) })
        .with_update_fn(|_| async { Ok(Vec::new()) })
        .with_disabled_connections()
        .with_plugin_path(dir.join("none"));
    let mut logs = Vec::new();
    for (i, script) in plugins.iter().enumerate() {
        let log = Log::default();
        let answers = ids(containers)
            .into_iter()
            .zip(&script.answers)
            .map(|(id, (d, a))| (id, (if timed { *d } else { 0 }, a.clone())))
            .collect();
        let plugin = Scripted {
            me: format!("p{i}"),
            answers,
            log: log.clone(),
            hold: None,
        };
        logs.push(log);
        b = b.with_builtin_plugin(
            format!("{}", 10 + i),
            format!("p{i}"),
            EventMask::parse("CreateContainer,StopContainer,RemoveContainer").unwrap(),
            Arc::new(plugin),
        );
        if timed && script.original_view {
            b = b.with_plugin_view(format!("p{i}"), PluginView::Original);
        }
    }
    (b.build().unwrap(), logs)
}

fn request(id: &str) -> api::CreateContainerRequest {
    let mut r = api::CreateContainerRequest::new();
    let pod = r.pod.mut_or_insert_default();
    pod.id = "pod".into();
    pod.name = "pod".into();
    let c = r.container.mut_or_insert_default();
    c.id = id.into();
    c.pod_sandbox_id = "pod".into();
    c.name = id.into();
    r
}

/// A create's outcome as compared: the response and who changed what, or
/// the error's text.
type Outcome = Result<(api::CreateContainerResponse, String), String>;

fn outcome(
    r: (
        Result<api::CreateContainerResponse, Error>,
        nri_adaptation::CreateReport,
    ),
    id: &str,
) -> Outcome {
    match r.0 {
        Ok(rsp) => Ok((rsp, format!("{:?}", r.1.changes(id)))),
        Err(e) => Err(format!(
            "{e}: {}",
            std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default()
        )),
    }
}

fn answer() -> impl Strategy<Value = Answer> {
    prop_oneof![
        4 => Just(Answer::Nothing),
        3 => prop_oneof![Just("A"), Just("B")].prop_map(Answer::Env),
        2 => prop_oneof![Just("x"), Just("y")].prop_map(Answer::Annotation),
        2 => (1i64..4).prop_map(|v| Answer::Memory(v << 20)),
        1 => Just(Answer::Fail),
    ]
}

fn scenario() -> impl Strategy<Value = Vec<PluginScript>> {
    const CONTAINERS: usize = 6;
    proptest::collection::vec(
        (
            any::<bool>(),
            proptest::collection::vec((0u64..1500, answer()), CONTAINERS),
        )
            .prop_map(|(original_view, answers)| PluginScript { original_view, answers }),
        1..=5,
    )
}

/// Waits until `cond` holds, for at most 5 s.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within 5 s");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random answers, delays and views; six creates at once: each create's
    /// merged response, field owners or error are those of the same
    /// plugins called one create at a time, one plugin after another; all
    /// plugins got the creates in one order; every failed create was undone
    /// at exactly the plugins that got it.
    #[test]
    fn concurrent_creates_merge_as_one_at_a_time(plugins in scenario()) {
        const N: usize = 6;
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        rt.block_on(async {
            let (reference, _) = adaptation(dir.path(), &plugins, N, false);
            reference.start().await.unwrap();
            let mut want = Vec::new();
            for id in ids(N) {
                want.push(outcome(reference.create_container_with_report(request(&id)).await, &id));
            }
            reference.stop().await;

            let (nri, logs) = adaptation(dir.path(), &plugins, N, true);
            nri.start().await.unwrap();
            // Each create as a runtime makes it: a failed one is followed by
            // StopContainer and RemoveContainer (the runtime contract).
            let tasks: Vec<_> = ids(N)
                .into_iter()
                .map(|id| {
                    let nri = nri.clone();
                    tokio::spawn(async move {
                        let r = outcome(nri.create_container_with_report(request(&id)).await, &id);
                        if r.is_err() {
                            let req = request(&id);
                            let stop = api::StopContainerRequest {
                                pod: req.pod.clone(),
                                container: req.container.clone(),
                                ..Default::default()
                            };
                            nri.stop_container(stop).await.unwrap();
                            nri.remove_container(&req.pod, &req.container).await.unwrap();
                        }
                        r
                    })
                })
                .collect();
            let mut got = Vec::new();
            for t in tasks {
                got.push(t.await.unwrap());
            }
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g, w, "container c{i}: concurrent {g:?}, one at a time {w:?}; plugins {plugins:?}");
            }
            // One order: the creates each plugin got are a subsequence of one
            // common order (pairwise consistent).
            let creates: Vec<Vec<String>> = logs
                .iter()
                .map(|l| l.lock().unwrap().iter().filter(|(e, _)| *e == "create").map(|(_, c)| c.clone()).collect())
                .collect();
            for a in &creates {
                for b in &creates {
                    let common_a: Vec<&String> = a.iter().filter(|c| b.contains(c)).collect();
                    let common_b: Vec<&String> = b.iter().filter(|c| a.contains(c)).collect();
                    assert_eq!(common_a, common_b, "plugins got creates in different orders");
                }
            }
            // The runtime's undo of a failed create reached every plugin
            // that got the create after it; no other container was stopped.
            for (i, w) in got.iter().enumerate() {
                let id = format!("c{i}");
                for log in &logs {
                    let l = log.lock().unwrap();
                    let pos = |ev: &str| l.iter().position(|(e, c)| *e == ev && *c == id);
                    match (w.is_err(), pos("create"), pos("stop"), pos("remove")) {
                        (true, Some(a), Some(b), Some(c)) => assert!(a < b && b < c, "{id}: {l:?}"),
                        (true, None, Some(b), Some(c)) => assert!(b < c, "{id}: {l:?}"),
                        (false, _, None, None) => {}
                        _ => panic!("{id} (failed: {}): {l:?}", w.is_err()),
                    }
                }
            }
            nri.stop().await;
        });
    }
}

/// Two plugins with the adjusted view; plugin 2 holds create c0 until
/// plugin 1 got create c1: a pipeline. Behind one lock across the chain,
/// c1 would wait for c0 and this would never happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_is_at_the_second_plugin_while_the_next_is_at_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let (l1, l2) = (Log::default(), Log::default());
    let gate = Arc::new(Notify::new());
    let p = |me: &str, log: &Log, hold: Option<(String, Arc<Notify>)>| {
        Arc::new(Scripted {
            me: me.into(),
            answers: HashMap::new(),
            log: log.clone(),
            hold,
        })
    };
    let nri = Adaptation::builder("ordering-test", "0")
        .with_sync_fn(|| async { Ok(RuntimeState::default()) })
        .with_update_fn(|_| async { Ok(Vec::new()) })
        .with_disabled_connections()
        .with_plugin_path(dir.path().join("none"))
        .with_builtin_plugin(
            "10",
            "one",
            EventMask::parse("CreateContainer").unwrap(),
            p("one", &l1, None),
        )
        .with_builtin_plugin(
            "20",
            "two",
            EventMask::parse("CreateContainer").unwrap(),
            p("two", &l2, Some(("c0".into(), gate.clone()))),
        )
        .build()
        .unwrap();
    nri.start().await.unwrap();
    let first = tokio::spawn({
        let nri = nri.clone();
        async move { nri.create_container(request("c0")).await }
    });
    eventually("plugin two gets c0", || !l2.lock().unwrap().is_empty()).await;
    let second = tokio::spawn({
        let nri = nri.clone();
        async move { nri.create_container(request("c1")).await }
    });
    eventually("plugin one gets c1 while two holds c0", || {
        l1.lock().unwrap().len() == 2
    })
    .await;
    assert_eq!(l2.lock().unwrap().len(), 1, "two must not get c1 before it answered c0");
    gate.notify_one();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    let order: Vec<String> = l2.lock().unwrap().iter().map(|(_, c)| c.clone()).collect();
    assert_eq!(order, ["c0", "c1"]);
    nri.stop().await;
}

/// With the original view, plugin 2 gets a create while plugin 1 still
/// holds it; and a StartContainer admitted after a held create reaches a
/// plugin only after that create.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn original_view_plugins_get_a_create_side_by_side_and_later_events_wait_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let (l1, l2) = (Log::default(), Log::default());
    let gate = Arc::new(Notify::new());
    let nri = Adaptation::builder("ordering-test", "0")
        .with_sync_fn(|| async { Ok(RuntimeState::default()) })
        .with_update_fn(|_| async { Ok(Vec::new()) })
        .with_disabled_connections()
        .with_plugin_path(dir.path().join("none"))
        .with_default_view(PluginView::Original)
        .with_builtin_plugin(
            "10",
            "one",
            EventMask::parse("CreateContainer").unwrap(),
            Arc::new(Scripted {
                me: "one".into(),
                answers: HashMap::new(),
                log: l1.clone(),
                hold: Some(("c0".into(), gate.clone())),
            }),
        )
        .with_builtin_plugin(
            "20",
            "two",
            EventMask::parse("CreateContainer,StartContainer").unwrap(),
            Arc::new(Scripted {
                me: "two".into(),
                answers: HashMap::new(),
                log: l2.clone(),
                hold: None,
            }),
        )
        .build()
        .unwrap();
    nri.start().await.unwrap();
    let create = tokio::spawn({
        let nri = nri.clone();
        async move { nri.create_container(request("c0")).await }
    });
    eventually("plugin two gets c0 while one holds it", || {
        !l2.lock().unwrap().is_empty()
    })
    .await;
    assert_eq!(l1.lock().unwrap().len(), 1);
    // Plugin one holds c0; a StartContainer of another container goes to
    // two only, and two has answered c0: it gets it at once.
    let pod = api::PodSandbox::default();
    let c = api::Container {
        id: "other".into(),
        ..Default::default()
    };
    nri.start_container(&pod, &c).await.unwrap();
    assert_eq!(
        *l2.lock().unwrap(),
        [("create", "c0".to_string()), ("start", "other".to_string())]
    );
    gate.notify_one();
    create.await.unwrap().unwrap();
    nri.stop().await;
}

/// A create that plugin 2 refuses: plugin 3 (adjusted view, after the
/// refusal) never gets it; the StopContainer and RemoveContainer the
/// runtime sends then reach plugin 1 and 2 after the create.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_create_stops_at_the_refusal_and_the_runtimes_undo_follows_it() {
    let dir = tempfile::tempdir().unwrap();
    let logs: Vec<Log> = (0..3).map(|_| Log::default()).collect();
    let mut b = Adaptation::builder("ordering-test", "0")
        .with_sync_fn(|| async { Ok(RuntimeState::default()) })
        .with_update_fn(|_| async { Ok(Vec::new()) })
        .with_disabled_connections()
        .with_plugin_path(dir.path().join("none"));
    for (i, log) in logs.iter().enumerate() {
        let answers = if i == 1 {
            HashMap::from([("c0".to_string(), (2000, Answer::Fail))])
        } else {
            HashMap::from([("c0".to_string(), (0, Answer::Env("A")))])
        };
        b = b.with_builtin_plugin(
            format!("{}", 10 * (i + 1)),
            format!("p{i}"),
            EventMask::parse("CreateContainer,StopContainer,RemoveContainer").unwrap(),
            Arc::new(Scripted {
                me: format!("p{i}"),
                answers,
                log: log.clone(),
                hold: None,
            }),
        );
    }
    let nri = b.build().unwrap();
    nri.start().await.unwrap();
    let req = request("c0");
    let e = nri.create_container(req.clone()).await.unwrap_err();
    let cause = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default();
    assert!(
        e.to_string().contains("20-p1") && cause.contains("p1 refuses c0"),
        "{e}: {cause}"
    );
    let stop = api::StopContainerRequest {
        pod: req.pod.clone(),
        container: req.container.clone(),
        ..Default::default()
    };
    nri.stop_container(stop).await.unwrap();
    nri.remove_container(&req.pod, &req.container).await.unwrap();
    let seq = |events: &[&'static str]| -> Vec<(&'static str, String)> {
        events.iter().map(|e| (*e, "c0".to_string())).collect()
    };
    assert_eq!(*logs[0].lock().unwrap(), seq(&["create", "stop", "remove"]));
    assert_eq!(*logs[1].lock().unwrap(), seq(&["create", "stop", "remove"]));
    assert_eq!(*logs[2].lock().unwrap(), seq(&["stop", "remove"]));
    nri.stop().await;
}
