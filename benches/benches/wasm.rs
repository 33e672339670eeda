//! `create/KIND/N`: one CreateContainer through N plugins that each answer
//! with an empty adjustment, for KIND `builtin` (in process, no
//! serialization), `process` (`nri-bench-plugin` processes on the
//! runtime's socket, ttrpc) and `wasm` (the adjuster module of
//! `plugins/wasm`, configured to adjust no container, so it decodes the
//! request and answers empty: the cost of the call itself).

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use nri_adaptation::{Adaptation, RuntimeState};
use nri_benches::{adaptation, bench_request, bench_setup, spawn_plugins};

fn wasm_adaptation(dir: &std::path::Path, n: usize) -> Adaptation {
    let (plugins, conf) = (dir.join("plugins"), dir.join("conf.d"));
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::create_dir_all(&conf).unwrap();
    for i in 0..n {
        let name = format!("{:02}-wasm{i}", 10 + i);
        nri_wasm_plugins::install(nri_wasm_plugins::ADJUSTER, &plugins, &name).unwrap();
        std::fs::write(conf.join(format!("{name}.conf")), "container none\n").unwrap();
    }
    Adaptation::builder("nri-bench", "0")
        .with_sync_fn(|| async { Ok(RuntimeState::default()) })
        .with_update_fn(|_| async { Ok(Vec::new()) })
        .with_disabled_connections()
        .with_plugin_path(plugins)
        .with_plugin_config_path(conf)
        .build()
        .expect("adaptation")
}

fn create(c: &mut Criterion) {
    let (rt, bin) = bench_setup();
    let mut group = c.benchmark_group("create");
    for n in [1usize, 8] {
        let dir = tempfile::tempdir().unwrap();
        let nri = adaptation(dir.path(), &vec![None; n]);
        rt.block_on(nri.start()).unwrap();
        group.bench_with_input(BenchmarkId::new("builtin", n), &n, |b, _| {
            b.to_async(&rt)
                .iter(|| async { nri.create_container(bench_request()).await.unwrap() })
        });
        rt.block_on(nri.stop());

        let dir = tempfile::tempdir().unwrap();
        let nri = adaptation(dir.path(), &[]);
        let procs = rt.block_on(async {
            nri.start().await.unwrap();
            spawn_plugins(&bin, &nri, &dir.path().join("nri.sock"), &vec![None; n]).await
        });
        group.bench_with_input(BenchmarkId::new("process", n), &n, |b, _| {
            b.to_async(&rt)
                .iter(|| async { nri.create_container(bench_request()).await.unwrap() })
        });
        rt.block_on(nri.stop());
        drop(procs);

        let dir = tempfile::tempdir().unwrap();
        let nri = wasm_adaptation(dir.path(), n);
        rt.block_on(nri.start()).unwrap();
        assert_eq!(nri.plugin_names().len(), n, "the WebAssembly plugins loaded");
        group.bench_with_input(BenchmarkId::new("wasm", n), &n, |b, _| {
            b.to_async(&rt)
                .iter(|| async { nri.create_container(bench_request()).await.unwrap() })
        });
        rt.block_on(nri.stop());
    }
    group.finish();
}

criterion_group!(benches, create);
criterion_main!(benches);
