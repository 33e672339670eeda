//! Thread priorities: the daemon's control thread runs at a raised one
//! (see `node::control`), and nothing it might start may inherit it.
//! Linux keeps a nice value per thread, and a new thread or process
//! starts with its creator's.

use std::{
    io,
    sync::atomic::{AtomicI32, Ordering},
};

/// The daemon's own nice value, as the first raised thread found it before
/// raising its priority; [`UNSET`] while no thread was raised.
static BASE_NICE: AtomicI32 = AtomicI32::new(UNSET);
/// No thread was raised: there is nothing to restore.
const UNSET: i32 = i32::MIN;

/// Gives the calling thread nice value `nice` (lower is a higher priority),
/// keeping the value it had for [`restore_base_nice`].
///
/// # Errors
/// setpriority's: lowering a nice value needs `CAP_SYS_NICE`.
pub fn raise_calling_thread(nice: i32) -> io::Result<()> {
    if let Some(base) = thread_nice() {
        // The first raised thread's: a second one (a restarted control
        // thread) started from a thread that may be raised itself.
        let _ = BASE_NICE.compare_exchange(UNSET, base, Ordering::Relaxed, Ordering::Relaxed);
    }
    // SAFETY: setpriority and gettid have no memory-safety preconditions.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread's nice value (`None` if it cannot be read).
pub fn thread_nice() -> Option<i32> {
    // getpriority returns the value itself: -1 is an error only with errno set.
    // SAFETY: errno is thread-local; getpriority and gettid have no
    // memory-safety preconditions.
    unsafe {
        *libc::__errno_location() = 0;
        let v = libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t);
        (v != -1 || *libc::__errno_location() == 0).then_some(v)
    }
}

/// For a child process between fork and exec (a helper, and through it
/// libcontainer's processes and the container), and for the thread that
/// replaces the daemon's image (an upgrade): gives the calling thread the
/// daemon's own nice value, never a raised thread's, whichever thread it
/// is. Does nothing while no thread was raised. Async-signal-safe (one
/// system call).
///
/// # Errors
/// setpriority's.
pub fn restore_base_nice() -> io::Result<()> {
    let base = BASE_NICE.load(Ordering::Relaxed);
    if base == UNSET {
        return Ok(());
    }
    // SAFETY: setpriority has no memory-safety preconditions; `who` 0 is
    // the calling thread, the only one of a forked child.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, base) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;

    use super::*;

    /// Field 19 (nice) of `/proc/self/stat` as `cat` prints it in a child.
    fn child_nice() -> i32 {
        let mut cmd = std::process::Command::new("cat");
        cmd.arg("/proc/self/stat");
        // SAFETY: restore_base_nice is async-signal-safe.
        unsafe { cmd.pre_exec(restore_base_nice) };
        let out = cmd.output().expect("run cat");
        let stat = String::from_utf8_lossy(&out.stdout).into_owned();
        let after_comm = stat.rsplit_once(')').expect("stat").1;
        after_comm
            .split_whitespace()
            .nth(16)
            .expect("nice field")
            .parse()
            .expect("nice")
    }

    #[test]
    fn a_child_of_a_raised_thread_runs_at_the_daemons_priority() {
        let base = thread_nice().expect("own nice");
        std::thread::spawn(move || {
            raise_calling_thread(-10).expect("raise (tests run as root)");
            assert_eq!(thread_nice(), Some(-10));
            // Without the reset a child would start at -10.
            assert_eq!(child_nice(), base);
        })
        .join()
        .unwrap();
        // The raised thread's priority stays its own.
        assert_eq!(thread_nice(), Some(base));
    }
}
