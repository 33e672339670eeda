use super::*;
use std::{
    io::{Read, Write},
    os::fd::FromRawFd,
};

#[test]
fn uris() {
    assert_eq!(path_of("/a/b").unwrap(), PathBuf::from("/a/b"));
    assert_eq!(path_of("file:///a/b").unwrap(), PathBuf::from("/a/b"));
    assert!(matches!(path_of("binary:///x"), Err(ShimError::InvalidArgument(_))));
    assert!(matches!(path_of("tcp://x"), Err(ShimError::InvalidArgument(_))));
}

#[tokio::test]
async fn fifo_output_and_piped_stdin() {
    let d = tempfile::tempdir().unwrap();
    let (o, i) = (d.path().join("out"), d.path().join("in"));
    nix::unistd::mkfifo(&o, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    nix::unistd::mkfifo(&i, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let spec = StdioSpec {
        stdin: i.to_string_lossy().into(),
        stdout: o.to_string_lossy().into(),
        stderr: String::new(),
        terminal: false,
    };
    let mut io = ProcessIo::prepare(&spec, &d.path().join("console.sock")).unwrap();
    let [stdin, stdout, _stderr] = io.take_fds().unwrap();
    // Every fd the daemon keeps is close-on-exec: a copy in a process
    // it spawns (or in the next image) would keep the pipe open.
    let live = io.live_fds();
    for fd in [stdin.as_raw_fd(), live.stdin_source.unwrap(), live.stdin_sink.unwrap()] {
        let flags = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert_ne!(flags & libc::FD_CLOEXEC, 0, "fd {fd} is inherited by children");
    }
    // Something written into the stdin fifo reaches the container's stdin.
    let mut client_in = OpenOptions::new().write(true).open(&i).unwrap();
    client_in.write_all(b"hello").unwrap();
    let mut stdin = File::from(stdin);
    let got = tokio::task::spawn_blocking(move || {
        let mut got = [0u8; 5];
        stdin.read_exact(&mut got).unwrap();
        (got, stdin)
    });
    let (got, mut stdin) = got.await.unwrap();
    assert_eq!(&got, b"hello");
    // The container's stdout reaches the fifo's reader.
    let mut reader = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&o)
        .unwrap();
    File::from(stdout).write_all(b"out").unwrap();
    let mut got = [0u8; 3];
    reader.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"out");
    // CloseIO: the container's stdin reads EOF.
    io.close_stdin();
    let rest = tokio::task::spawn_blocking(move || {
        let mut rest = Vec::new();
        stdin.read_to_end(&mut rest).map(|_| rest)
    });
    assert_eq!(rest.await.unwrap().unwrap(), b"");
}

/// A process's stdio with only a stdin fifo, prepared: (its temp dir,
/// the fifo, the ProcessIo, the process's end of the stdin pipe).
fn stdin_fifo_io() -> (tempfile::TempDir, PathBuf, ProcessIo, OwnedFd) {
    let d = tempfile::tempdir().unwrap();
    let i = d.path().join("in");
    nix::unistd::mkfifo(&i, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let spec = StdioSpec {
        stdin: i.to_string_lossy().into(),
        ..Default::default()
    };
    let mut io = ProcessIo::prepare(&spec, &d.path().join("console.sock")).unwrap();
    let [stdin, _, _] = io.take_fds().unwrap();
    (d, i, io, stdin)
}

/// A writer that closes the stdin fifo gives the process end of file,
/// without CloseIO; one that connects only later still gets through.
#[tokio::test]
async fn the_last_writer_closing_stdin_is_end_of_file() {
    let (_d, i, io, stdin) = stdin_fifo_io();
    let reader = tokio::task::spawn_blocking(move || {
        let mut all = Vec::new();
        File::from(stdin).read_to_end(&mut all).map(|_| all)
    });
    // No writer yet: not an end of file.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!reader.is_finished());
    let path = i.clone();
    tokio::task::spawn_blocking(move || {
        let mut w = OpenOptions::new().write(true).open(&path).unwrap();
        w.write_all(b"hello").unwrap();
    })
    .await
    .unwrap();
    let all = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .expect("end of file once the writer closed")
        .unwrap()
        .unwrap();
    assert_eq!(all, b"hello");
    drop(io);
}

#[tokio::test]
async fn dropping_process_io_ends_the_stdin_copier() {
    let (_d, _i, io, stdin) = stdin_fifo_io();
    drop(io);
    // The copier dropped the pipe's write end: the reader sees EOF
    // instead of blocking forever.
    let rest = tokio::task::spawn_blocking(move || {
        let mut rest = Vec::new();
        File::from(stdin).read_to_end(&mut rest).map(|_| rest)
    });
    assert_eq!(rest.await.unwrap().unwrap(), b"");
}

/// An upgrade parks the stdin copier between a write and the next
/// read: input written meanwhile stays in the fifo (no byte is held by
/// the task the exec ends), and unparked, the copy goes on.
#[tokio::test]
async fn a_parked_stdin_copier_leaves_input_in_the_fifo() {
    let (_d, i, io, stdin) = stdin_fifo_io();
    let stdin = tokio::net::unix::pipe::Receiver::from_owned_fd(stdin).unwrap();
    let mut client = OpenOptions::new().write(true).open(&i).unwrap();
    let read_some = |n: usize| {
        let stdin = &stdin;
        async move {
            let mut got = vec![0u8; n];
            let mut at = 0;
            while at < n {
                stdin.readable().await.unwrap();
                match stdin.try_read(&mut got[at..]) {
                    Ok(k) => at += k,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("{e}"),
                }
            }
            got
        }
    };
    client.write_all(b"one").unwrap();
    assert_eq!(read_some(3).await, b"one");
    let mut parks: Vec<StdinPark> = io.stdin_park().into_iter().collect();
    assert_eq!(
        park_stdin(&mut parks, Duration::from_secs(1)).await,
        0,
        "parked at once"
    );
    client.write_all(b"two").unwrap();
    let early = tokio::time::timeout(Duration::from_millis(200), read_some(1)).await;
    assert!(early.is_err(), "copied while parked: {early:?}");
    unpark_stdin(&parks);
    assert_eq!(read_some(3).await, b"two");
}

/// A pty pair: (master, slave), both close-on-exec.
fn pty() -> (File, File) {
    // SAFETY: plain libc calls on an fd this function owns.
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(m >= 0, "posix_openpt");
        assert_eq!(libc::grantpt(m), 0);
        assert_eq!(libc::unlockpt(m), 0);
        let mut name = [0 as libc::c_char; 64];
        assert_eq!(libc::ptsname_r(m, name.as_mut_ptr(), name.len()), 0);
        let path = std::ffi::CStr::from_ptr(name.as_ptr()).to_str().unwrap().to_string();
        let slave = OpenOptions::new().read(true).write(true).open(path).unwrap();
        (File::from_raw_fd(m), slave)
    }
}

fn wait_for(path: &Path, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = std::fs::read_to_string(path).unwrap_or_default();
        if got.contains(want) || Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// An upgrade stops a terminal's copiers between reads: what the
/// process writes meanwhile stays in the pty (nothing is held by a
/// thread that the exec would end), and the copy picks it up again.
#[tokio::test]
async fn a_stopped_terminal_copier_leaves_output_in_the_pty() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let spec = StdioSpec {
        stdout: out.display().to_string(),
        terminal: true,
        ..Default::default()
    };
    let (master, mut slave) = pty();
    let mut io = ProcessIo::unconnected(&spec);
    io.copy_terminal(master, None, None).unwrap();
    slave.write_all(b"one\n").unwrap();
    assert!(wait_for(&out, "one").contains("one"));
    assert!(io.stop_terminal(Duration::from_secs(1)), "the copier stops at once");
    assert!(
        io.live_fds().term_output.is_some(),
        "the stdout fifo stays open to be handed over"
    );
    slave.write_all(b"two\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !std::fs::read_to_string(&out).unwrap().contains("two"),
        "copied while stopped"
    );
    io.restart_terminal().unwrap();
    assert!(wait_for(&out, "two").contains("two"), "the output after a restart");
    // The slave gone: the copy ends and says the output is drained.
    let drained = io.output_drained().unwrap();
    drop(slave);
    tokio::time::timeout(Duration::from_secs(5), drained)
        .await
        .unwrap()
        .ok();
    assert_eq!(io.live_fds().term_output, None, "the copy ended: the fifo is closed");
}

/// A process's stdio with stdout and stderr fifos, prepared: (its temp
/// dir, the two fifos, the ProcessIo, the process's stdout and stderr).
fn output_fifos_io() -> (tempfile::TempDir, [PathBuf; 2], ProcessIo, [OwnedFd; 2]) {
    let d = tempfile::tempdir().unwrap();
    let (o, e) = (d.path().join("out"), d.path().join("err"));
    for p in [&o, &e] {
        nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    }
    let spec = StdioSpec {
        stdout: o.to_string_lossy().into(),
        stderr: e.to_string_lossy().into(),
        ..Default::default()
    };
    let mut io = ProcessIo::prepare(&spec, &d.path().join("console.sock")).unwrap();
    let [_, stdout, stderr] = io.take_fds().unwrap();
    (d, [o, e], io, [stdout, stderr])
}

/// Reads `fifo` as containerd's CRI does for an exec: a blocking open,
/// then everything up to end of file; gives up after 10 s.
async fn read_fifo(fifo: &Path) -> Option<Vec<u8>> {
    let path = fifo.to_path_buf();
    let mut read = tokio::task::spawn_blocking(move || {
        let mut got = Vec::new();
        File::open(path).and_then(|mut f| f.read_to_end(&mut got)).map(|_| got)
    });
    match tokio::time::timeout(Duration::from_secs(10), &mut read).await {
        Ok(r) => Some(r.unwrap().unwrap()),
        Err(_) => {
            // Unblocks the reader (a blocked open counts as a reader, so
            // this open succeeds), or the runtime would wait for it.
            drop(OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(fifo));
            let _ = read.await;
            None
        }
    }
}

#[tokio::test]
async fn output_written_before_the_reader_opens_reaches_it_with_end_of_file() {
    // The process writes and exits before containerd opens the fifos for
    // reading (an ExecSync of `echo out; echo err >&2` under load).
    let (_d, [o, e], mut io, [stdout, stderr]) = output_fifos_io();
    File::from(stdout).write_all(b"out\n").unwrap();
    File::from(stderr).write_all(b"err\n").unwrap();
    io.hand_over_outputs();
    assert_eq!(read_fifo(&o).await.as_deref(), Some(&b"out\n"[..]), "stdout");
    assert_eq!(read_fifo(&e).await.as_deref(), Some(&b"err\n"[..]), "stderr");
}

#[tokio::test]
async fn output_fifos_are_let_go_once_read_or_when_the_process_is_deleted() {
    // A reader already there: the daemon's handles close at the handover,
    // so the reader sees end of file once the process's fds close.
    let (_d, [o, _], mut io, [stdout, stderr]) = output_fifos_io();
    let reader = tokio::spawn({
        let o = o.clone();
        async move { read_fifo(&o).await }
    });
    File::from(stdout).write_all(b"x").unwrap();
    drop(stderr);
    tokio::time::sleep(Duration::from_millis(50)).await;
    io.hand_over_outputs();
    assert_eq!(reader.await.unwrap().as_deref(), Some(&b"x"[..]));
    // No reader ever: deleting the process lets the fifos go (a
    // non-blocking reader then sees no writer: end of file, not EAGAIN).
    let (_d, [o, e], mut io, fds) = output_fifos_io();
    drop(fds);
    io.hand_over_outputs();
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(io);
    tokio::time::sleep(Duration::from_millis(20)).await;
    for p in [&o, &e] {
        let mut r = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(p)
            .unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(r.read(&mut buf).unwrap(), 0, "{} still has a writer", p.display());
    }
}

#[tokio::test]
async fn terminal_output_copied_before_the_reader_opens_reaches_it_with_end_of_file() {
    // `exec -t` that prints and exits before containerd opens the stdout
    // fifo: the copier writes into the fifo and ends (the slave gone).
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    nix::unistd::mkfifo(&out, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let spec = StdioSpec {
        stdout: out.display().to_string(),
        terminal: true,
        ..Default::default()
    };
    let (master, mut slave) = pty();
    let mut io = ProcessIo::unconnected(&spec);
    io.copy_terminal(master, None, None).unwrap();
    let drained = io.output_drained().unwrap();
    slave.write_all(b"tty").unwrap();
    drop(slave);
    tokio::time::timeout(Duration::from_secs(5), drained)
        .await
        .expect("the copy ends with the slave")
        .ok();
    io.hand_over_outputs();
    assert_eq!(read_fifo(&out).await.as_deref(), Some(&b"tty"[..]));
}
