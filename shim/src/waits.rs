//! What a request waited on, and a daemon that notices when it cannot run.
//!
//! One daemon serves every container of the node from one runtime thread:
//! a blocking call there (an unmount that syncs a filesystem, an fsync, a
//! write throttled by dirty-page writeback) would stall every request of
//! every pod. Blocking steps of a request go to tokio's blocking pool
//! through [`blocking`]; those and the awaited steps named with [`timed`]
//! (NRI, the libcontainer helper) are recorded for the request in progress,
//! and a request that took [`SLOW`] or more is logged at warn with what it
//! waited on ([`request`]). [`start_watchdog`] watches the runtime thread itself
//! from a thread of its own and logs, at warn, when it did not run for
//! [`SLOW`], with the system call and kernel function it was in.

use std::{
    cell::RefCell,
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// A request (or the runtime thread) slower than this is logged at warn.
pub const SLOW: Duration = Duration::from_secs(1);

tokio::task_local! {
    /// The steps of the request in progress: (what, how long), in order.
    static STEPS: RefCell<Vec<(&'static str, Duration)>>;
}

/// Runs `fut`, request `what` (a Task method) of task `task`, recording its
/// steps; a request that took [`SLOW`] or more is logged at warn with the
/// steps that took longest and the time spent on the runtime thread
/// (computing, or queued behind other requests).
pub async fn request<T>(what: &'static str, task: &str, fut: impl Future<Output = T>) -> T {
    let start = Instant::now();
    let (out, steps) = STEPS
        .scope(RefCell::new(Vec::new()), async {
            let out = fut.await;
            (out, STEPS.with(|s| s.take()))
        })
        .await;
    let took = start.elapsed();
    if took >= SLOW {
        // What no step accounts for: time on the runtime thread, in work
        // or queued behind other requests (a lock, a busy thread). Unlike
        // the steps (this request's own helper process, its own mounts and
        // files), this is time the daemon made the request wait.
        let on_runtime_thread = unaccounted(&steps, took);
        tracing::warn!(
            request = what,
            task,
            took_ms = took.as_millis() as u64,
            runtime_thread_ms = on_runtime_thread.as_millis() as u64,
            waited_on = %describe(&steps, took),
            "a request took more than 1 s"
        );
    }
    out
}

/// Awaits `fut` as step `what` of the request in progress (if any).
pub async fn timed<F: Future>(what: &'static str, fut: F) -> F::Output {
    let start = Instant::now();
    let out = fut.await;
    let took = start.elapsed();
    let _ = STEPS.try_with(|s| s.borrow_mut().push((what, took)));
    out
}

/// Runs `f` on the blocking pool as step `what`: never on the runtime
/// thread, whatever the kernel makes it wait for. A panic in `f` is the
/// caller's.
pub async fn blocking<T: Send + 'static>(what: &'static str, f: impl FnOnce() -> T + Send + 'static) -> T {
    timed(what, async {
        match tokio::task::spawn_blocking(f).await {
            Ok(v) => v,
            Err(e) => match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(e) => panic!("blocking step {what}: {e}"),
            },
        }
    })
    .await
}

/// What of `took` no step accounts for: time on the runtime thread.
fn unaccounted(steps: &[(&'static str, Duration)], took: Duration) -> Duration {
    took.saturating_sub(steps.iter().map(|s| s.1).sum())
}

/// `step 1.20 s, step 0.31 s, ...`: the slowest steps first, then what is
/// left of `took` (time on the runtime thread).
fn describe(steps: &[(&'static str, Duration)], took: Duration) -> String {
    let mut sorted = steps.to_vec();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.1));
    let mut parts: Vec<String> = sorted
        .iter()
        .take(4)
        .map(|(what, d)| format!("{what} {:.2} s", d.as_secs_f64()))
        .collect();
    parts.push(format!(
        "the runtime thread (work, or queued behind others) {:.2} s",
        unaccounted(steps, took).as_secs_f64()
    ));
    parts.join(", ")
}

/// Watches the runtime thread: a task on it beats every 100 ms, a thread
/// of its own checks the beat and logs at warn once the beat is [`SLOW`]
/// late, naming what the runtime thread is in (its system call, the
/// kernel function it sleeps in, the top of its kernel stack), and at
/// info when it runs again. Call once, from the runtime thread (its
/// thread id is the one watched).
///
/// # Errors
/// When the watching thread cannot be started.
pub fn start_watchdog() -> std::io::Result<()> {
    {
        let origin = Instant::now();
        let beat = Arc::new(AtomicU64::new(0));
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let b = beat.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                b.store(origin.elapsed().as_millis() as u64, Ordering::Relaxed);
            }
        });
        let b = beat.clone();
        std::thread::Builder::new()
            .name("nri-shim-watchdog".into())
            .spawn(move || {
                let mut stalled = false;
                loop {
                    std::thread::sleep(Duration::from_millis(100));
                    let late = Duration::from_millis(
                        (origin.elapsed().as_millis() as u64).saturating_sub(b.load(Ordering::Relaxed)),
                    );
                    if late >= SLOW && !stalled {
                        stalled = true;
                        tracing::warn!(
                            thread = tid,
                            late_ms = late.as_millis() as u64,
                            waits_in = %kernel_wait(tid),
                            "the daemon's runtime thread has not run for more than 1 s: every request waits"
                        );
                    } else if late < Duration::from_millis(300) && stalled {
                        stalled = false;
                        tracing::info!(thread = tid, "the daemon's runtime thread runs again");
                    }
                }
            })?;
        Ok(())
    }
}

/// What thread `tid` of this process waits in, as the kernel says: the
/// system call (`/proc/self/task/<tid>/syscall`), the function it sleeps
/// in (`wchan`) and the top of its kernel stack (`stack`, root only).
pub fn kernel_wait(tid: i32) -> String {
    let read = |f: &str| std::fs::read_to_string(format!("/proc/self/task/{tid}/{f}")).unwrap_or_default();
    let syscall = read("syscall");
    let nr = syscall.split_whitespace().next().unwrap_or("");
    let call = match nr.parse::<i64>() {
        Ok(n) => syscall_name(n).map_or_else(|| format!("syscall {n}"), str::to_string),
        Err(_) if nr == "running" => "running (not in a system call)".to_string(),
        Err(_) => format!("{nr:?}"),
    };
    let wchan = read("wchan");
    let stack: Vec<String> = read("stack")
        .lines()
        .take(4)
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|f| f.split('+').next().unwrap_or(f).to_string())
        .collect();
    format!(
        "{call}, wchan {}, kernel stack [{}]",
        if wchan.is_empty() || wchan == "0" {
            "-"
        } else {
            wchan.trim()
        },
        stack.join(" < ")
    )
}

/// The name of system call `nr` of this architecture, for those a daemon
/// blocks in.
fn syscall_name(nr: i64) -> Option<&'static str> {
    let known: &[(libc::c_long, &str)] = &[
        (libc::SYS_read, "read"),
        (libc::SYS_write, "write"),
        (libc::SYS_openat, "openat"),
        (libc::SYS_close, "close"),
        (libc::SYS_fsync, "fsync"),
        (libc::SYS_fdatasync, "fdatasync"),
        (libc::SYS_sync, "sync"),
        (libc::SYS_syncfs, "syncfs"),
        (libc::SYS_mount, "mount"),
        (libc::SYS_umount2, "umount2"),
        (libc::SYS_renameat2, "renameat2"),
        (libc::SYS_unlinkat, "unlinkat"),
        (libc::SYS_mkdirat, "mkdirat"),
        (libc::SYS_wait4, "wait4"),
        (libc::SYS_waitid, "waitid"),
        (libc::SYS_clone, "clone"),
        (libc::SYS_clone3, "clone3"),
        (libc::SYS_execve, "execve"),
        (libc::SYS_futex, "futex"),
        (libc::SYS_epoll_pwait, "epoll_pwait"),
        (libc::SYS_ioctl, "ioctl"),
        (libc::SYS_getdents64, "getdents64"),
        (libc::SYS_newfstatat, "newfstatat"),
        (libc::SYS_statx, "statx"),
    ];
    known.iter().find(|(n, _)| *n == nr).map(|(_, name)| *name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slowest_steps_come_first_then_the_runtime_threads_share() {
        let steps = [
            ("NRI CreateContainer", Duration::from_millis(100)),
            ("unmount rootfs", Duration::from_millis(1300)),
        ];
        assert_eq!(
            describe(&steps, Duration::from_millis(1600)),
            "unmount rootfs 1.30 s, NRI CreateContainer 0.10 s, \
             the runtime thread (work, or queued behind others) 0.20 s"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn steps_are_recorded_for_the_request_in_progress_only() {
        let steps = STEPS
            .scope(RefCell::new(Vec::new()), async {
                timed("a", async {}).await;
                assert_eq!(blocking("b", || 7).await, 7);
                STEPS.with(|s| s.take())
            })
            .await;
        assert_eq!(steps.iter().map(|s| s.0).collect::<Vec<_>>(), ["a", "b"]);
        // Outside a request: nothing to record, no panic.
        timed("c", async {}).await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_blocking_step_leaves_the_runtime_thread_free() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        // The step blocks until the runtime thread has run something else.
        let step = tokio::spawn(blocking("waits", move || rx.recv().is_ok()));
        tokio::task::yield_now().await;
        tx.send(()).unwrap();
        assert!(step.await.unwrap());
    }

    /// A runtime thread that blocks is reported, with what it is in, and
    /// its return too; a request of a second or more is reported with its
    /// slowest step. (One test: both need the process's one global
    /// subscriber.)
    #[test]
    fn a_blocked_runtime_thread_and_a_slow_request_are_reported() {
        let lines = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let sink = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || CaptureWriter(sink.clone()))
            .finish();
        // The watchdog logs from its own thread: the global subscriber.
        let _ = tracing::subscriber::set_global_default(subscriber);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            start_watchdog().unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
            // A blocking call on the runtime thread.
            std::thread::sleep(Duration::from_millis(1600));
            tokio::time::sleep(Duration::from_millis(600)).await;
            request("Delete", "c1", async {
                timed("unmount rootfs", tokio::time::sleep(Duration::from_millis(1100))).await;
            })
            .await;
            // Queued behind something that is no step of its own (a
            // lock another request holds).
            request("Kill", "c3", tokio::time::sleep(Duration::from_millis(1100))).await;
            // A fast one is not reported.
            request("State", "c2", async {}).await;
        });
        let text = String::from_utf8_lossy(&lines.lock().unwrap()).into_owned();
        assert!(
            text.contains("the daemon's runtime thread has not run for more than 1 s") && text.contains("wchan"),
            "{text}"
        );
        assert!(text.contains("the daemon's runtime thread runs again"), "{text}");
        let slow: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("a request took more than 1 s"))
            .collect();
        assert_eq!(slow.len(), 2, "{text}");
        assert!(
            slow[0].contains("request=\"Delete\"")
                && slow[0].contains("task=\"c1\"")
                && slow[0].contains("waited_on=unmount rootfs 1."),
            "{}",
            slow[0]
        );
        // The step was the request's own: the daemon made it wait
        // (almost) nothing.
        let runtime_thread_ms = |line: &str| -> u64 {
            line.split("runtime_thread_ms=")
                .nth(1)
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no runtime_thread_ms: {line}"))
        };
        let queued = runtime_thread_ms(slow[0]);
        assert!(queued < 100, "{}", slow[0]);
        assert!(
            slow[1].contains("request=\"Kill\"") && runtime_thread_ms(slow[1]) >= 1000,
            "{}",
            slow[1]
        );
    }

    struct CaptureWriter(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for CaptureWriter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_kernel_says_what_a_thread_waits_in() {
        // This thread, reading its own: running, or in the read of the file.
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let w = kernel_wait(me);
        assert!(w.contains("wchan"), "{w}");
        assert!(
            w.starts_with("running") || w.starts_with("read") || w.starts_with("syscall"),
            "{w}"
        );
        assert_eq!(syscall_name(libc::SYS_umount2), Some("umount2"));
    }
}
