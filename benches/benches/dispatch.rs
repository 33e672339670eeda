//! `dispatch/socket/N`: round trip of one CreateContainer through N Rust
//! stub plugins, each a separate process on the runtime's socket, each
//! answering with an empty response.
//!
//! `dispatch/floor/N`: the same round trips with no NRI code: the encoded
//! request, length-prefixed, to N echo processes in turn over plain unix
//! sockets, each answering with an empty message. What the machine's
//! process wakeups cost before ttrpc, protobuf and the mux add anything.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use nri_benches::{Procs, adaptation, bench_request, bench_setup, spawn_plugins};
use protobuf::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn dispatch(c: &mut Criterion) {
    let (rt, bin) = bench_setup();
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
    let payload = bench_request().write_to_bytes().expect("encode");
    let mut msg = (payload.len() as u32).to_be_bytes().to_vec();
    msg.extend_from_slice(&payload);
    for n in [1usize, 8] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("echo.sock");
        let (mut conns, procs) = rt.block_on(async {
            let l = tokio::net::UnixListener::bind(&path).unwrap();
            let mut procs = Procs(Vec::new());
            let mut conns = Vec::new();
            for _ in 0..n {
                let child = std::process::Command::new(&bin).arg("--echo").arg(&path).spawn();
                procs.0.push(child.expect("spawn nri-bench-plugin --echo"));
                conns.push(l.accept().await.unwrap().0);
            }
            (conns, procs)
        });
        group.bench_with_input(BenchmarkId::new("floor", n), &n, |b, _| {
            b.iter(|| {
                rt.block_on(async {
                    for c in conns.iter_mut() {
                        c.write_all(&msg).await.unwrap();
                        let mut len = [0u8; 4];
                        c.read_exact(&mut len).await.unwrap();
                    }
                })
            })
        });
        drop(conns);
        drop(procs);
    }
    group.finish();
}

criterion_group!(benches, dispatch);
criterion_main!(benches);
