//! `dispatch/socket/N`: round trip of one CreateContainer through N Rust
//! stub plugins, each a separate process on the runtime's socket, each
//! answering with an empty response.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use nri_benches::{adaptation, bench_request, sibling_bin, spawn_plugins};

fn dispatch(c: &mut Criterion) {
    // A current-thread runtime, as the shim daemon uses: on these 2-core
    // machines it halves the round trip of a multi-thread runtime.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let bin = sibling_bin("nri-bench-plugin");
    assert!(
        bin.exists(),
        "{} missing: cargo build --release -p nri-benches",
        bin.display()
    );
    let mut group = c.benchmark_group("dispatch");
    for n in [1usize, 2, 4, 8] {
        let dir = tempfile::tempdir().unwrap();
        let nri = adaptation(dir.path(), &[]);
        let procs = rt.block_on(async {
            nri.start().await.unwrap();
            spawn_plugins(&bin, &nri, &dir.path().join("nri.sock"), &vec![None; n]).await
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

criterion_group!(benches, dispatch);
criterion_main!(benches);
