//! `merge/in_process/N` and `merge/socket/N`: a fresh CreateContainerRequest
//! through N plugins whose responses all merge (slot i of
//! `nri_benches::slot_response`): in-process builtin plugins (dispatch and
//! merge, no socket) and plugin processes over the socket.
//!
//! `merge/floor/8` and `merge/floor_view/8`: the workload's own share of
//! `in_process/8`, and that plus the one copy of each answer a view for
//! the next plugin needs (see the benches' comments).

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use nri_benches::{adaptation, bench_request, bench_setup, slot_response, spawn_plugins};

fn merge(c: &mut Criterion) {
    let (rt, bin) = bench_setup();
    let mut group = c.benchmark_group("merge");
    // The workload's own share of `in_process/8`: a fresh request and the
    // eight responses the builtin plugins clone. No adaptation code runs.
    let responses: Vec<_> = (0..8).map(slot_response).collect();
    group.bench_function("floor/8", |b| {
        b.iter(|| std::hint::black_box((bench_request(), responses.clone())))
    });
    // The floor plus one more copy of each answer: the least a merge that
    // hands the next plugin the container with the answers before it (the
    // adjusted view, as upstream) must copy, as the reply and the
    // container it leaves are separate messages. No adaptation code runs.
    group.bench_function("floor_view/8", |b| {
        b.iter(|| {
            let answers = responses.clone();
            let view = answers.clone();
            std::hint::black_box((bench_request(), answers, view))
        })
    });
    for n in [1usize, 2, 4, 8] {
        let slots: Vec<Option<usize>> = (0..n).map(Some).collect();
        let dir = tempfile::tempdir().unwrap();
        let nri = adaptation(dir.path(), &slots);
        rt.block_on(nri.start()).unwrap();
        group.bench_with_input(BenchmarkId::new("in_process", n), &n, |b, _| {
            b.to_async(&rt)
                .iter(|| async { nri.create_container(bench_request()).await.unwrap() })
        });
        rt.block_on(nri.stop());
    }
    for n in [1usize, 2, 4, 8] {
        let slots: Vec<Option<usize>> = (0..n).map(Some).collect();
        let dir = tempfile::tempdir().unwrap();
        let nri = adaptation(dir.path(), &[]);
        let procs = rt.block_on(async {
            nri.start().await.unwrap();
            spawn_plugins(&bin, &nri, &dir.path().join("nri.sock"), &slots).await
        });
        group.bench_with_input(BenchmarkId::new("socket", n), &n, |b, _| {
            b.to_async(&rt)
                .iter(|| async { nri.create_container(bench_request()).await.unwrap() })
        });
        rt.block_on(nri.stop());
        drop(procs);
    }
    group.finish();
}

criterion_group!(benches, merge);
criterion_main!(benches);
