//! The CRI lane's streaming calls: Exec with a tty or piped stdin, and
//! Attach, as `kubectl exec -it` and `kubectl attach` use them. containerd's
//! CRI answers Exec/Attach with a URL of its streaming server; this client
//! speaks the Kubernetes remote-command protocol `v4.channel.k8s.io` over a
//! WebSocket there: every binary message starts with its channel (0 stdin,
//! 1 stdout, 2 stderr, 3 the final status as JSON, 4 terminal resize).

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest, http::HeaderValue};

use super::{NS, both, pod, running};
use integration::{
    cri::{Client, Cri, api, container},
    parity::expect_value,
};

/// What a stream returned: stdout and stderr text, and the exit status
/// from the status channel ("Success" or the exit code of a failure).
#[derive(Debug, Default, PartialEq)]
struct Streamed {
    stdout: String,
    stderr: String,
    status: String,
}

/// Connects to a streaming URL, sends `input` (channel, bytes) messages in
/// order (each 200 ms apart, so a shell reads them as typed lines) and reads
/// until the server closes or `until` appears on stdout; at most 20 s.
async fn stream(url: &str, input: &[(u8, &[u8])], until: Option<&str>) -> Streamed {
    let mut req = url.replacen("http://", "ws://", 1).into_client_request().unwrap();
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", HeaderValue::from_static("v4.channel.k8s.io"));
    let (ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .unwrap_or_else(|e| panic!("WebSocket to {url}: {e}"));
    let (mut tx, mut rx) = ws.split();
    let input: Vec<(u8, Vec<u8>)> = input.iter().map(|(c, b)| (*c, b.to_vec())).collect();
    // Whether the reader has seen a shell prompt on stdout, for the writer.
    let (prompt_tx, mut prompt) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(async move {
        let mut after_resize = false;
        for (chan, bytes) in input {
            // A resize (channel 4) reaches the shim over ttrpc once the exec
            // has started, typed input over the stdin fifo: input already
            // queued reaches the shell as soon as it runs, and can overtake
            // the resize (for both shims, under load: in the VM lane with
            // the suite in parallel `stty size` printed the old size). So
            // after a resize, type only once the shell's prompt is there,
            // and a second later.
            if after_resize {
                let _ = tokio::time::timeout(Duration::from_secs(15), prompt.wait_for(|&p| p)).await;
                tokio::time::sleep(Duration::from_millis(1000)).await;
            } else {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            after_resize = chan == 4;
            let mut msg = vec![chan];
            msg.extend_from_slice(&bytes);
            if tx.send(Message::binary(msg)).await.is_err() {
                return;
            }
        }
        // Keep the socket open until the reader is done.
        std::future::pending::<()>().await;
    });
    let mut out = Streamed::default();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(next) = tokio::time::timeout(left, rx.next()).await else {
            panic!("stream {url}: nothing more within 20 s; so far {out:?}");
        };
        let Some(Ok(msg)) = next else { break };
        let data = match msg {
            Message::Binary(b) => b.to_vec(),
            Message::Close(_) => break,
            _ => continue,
        };
        let Some((&chan, body)) = data.split_first() else {
            continue;
        };
        let text = String::from_utf8_lossy(body);
        match chan {
            1 => {
                out.stdout.push_str(&text);
                prompt_tx.send_replace(out.stdout.contains("# "));
            }
            2 => out.stderr.push_str(&text),
            3 if !body.is_empty() => out.status = exit_of(&text),
            _ => {}
        }
        if until.is_some_and(|u| out.stdout.contains(u)) {
            break;
        }
    }
    writer.abort();
    out
}

/// The exit from a remote-command status: "Success", or "exit N" from the
/// `ExitCode` cause of a failure.
fn exit_of(status: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(status).unwrap_or_else(|e| panic!("status {status:?}: {e}"));
    if v["status"] == "Success" {
        return "Success".into();
    }
    v["details"]["causes"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["reason"] == "ExitCode"))
        .map(|c| format!("exit {}", c["message"].as_str().unwrap_or("?")))
        .unwrap_or_else(|| status.to_string())
}

async fn exec_url(c: &mut Client, id: &str, cmd: &[&str], tty: bool, stdin: bool) -> String {
    c.rt.exec(api::ExecRequest {
        container_id: id.into(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        tty,
        stdin,
        stdout: true,
        stderr: !tty,
    })
    .await
    .unwrap_or_else(|e| panic!("Exec in {id}: {e}"))
    .into_inner()
    .url
}

/// `kubectl exec -it ... sh`: a shell on a tty, sized by a resize message,
/// runs typed lines and exits with the code typed last.
async fn exec_tty(cri: &Cri, h: &'static str) -> Streamed {
    let (mut c, pod, cfg) = pod(cri, "exec-tty", NS, h, |_| {}).await;
    let id = running(&mut c, &pod, &cfg, container("c", &["sleep", "1000"])).await;
    let url = exec_url(&mut c, &id, &["sh"], true, true).await;
    let got = stream(
        &url,
        &[
            (4, br#"{"Width":100,"Height":30}"#),
            (0, b"stty size; tty; echo answer=$((6*7))\n"),
            (0, b"exit 3\n"),
        ],
        None,
    )
    .await;
    c.remove_pod(&pod).await;
    println!("{h}: the tty's whole output: {:?}", got.stdout);
    for l in cri
        .log()
        .lines()
        .filter(|l| l.contains("resize") || l.contains("Resize"))
    {
        println!("{h}: containerd: {l}");
    }
    // The tty echoes the typed lines and ends lines with \r\n; keep the
    // lines the shell printed.
    let stdout = got
        .stdout
        .replace('\r', "")
        .lines()
        .filter(|l| l.starts_with("30 ") || l.starts_with("/dev/") || l.starts_with("answer="))
        .collect::<Vec<_>>()
        .join("\n");
    Streamed { stdout, ..got }
}

#[tokio::test]
async fn exec_with_a_tty_resize_and_exit_code() {
    let cri = super::shared();
    let (runc, nri) = both(|h| exec_tty(cri, h)).await;
    expect_value(
        "exec -it sh (tty)",
        &Streamed {
            stdout: "30 100\n/dev/pts/0\nanswer=42".into(),
            stderr: String::new(),
            status: "exit 3".into(),
        },
        &runc,
        &nri,
    );
}

/// `kubectl exec -i ... head -c 11`: stdin piped to a process without a
/// tty, stdout and stderr apart.
async fn exec_stdin(cri: &Cri, h: &'static str) -> Streamed {
    let (mut c, pod, cfg) = pod(cri, "exec-stdin", NS, h, |_| {}).await;
    let id = running(&mut c, &pod, &cfg, container("c", &["sleep", "1000"])).await;
    let script = "head -c 11 | tr a-z A-Z; echo to-stderr >&2; exit 4";
    let url = exec_url(&mut c, &id, &["sh", "-c", script], false, true).await;
    let got = stream(&url, &[(0, b"hello "), (0, b"world and more")], None).await;
    c.remove_pod(&pod).await;
    got
}

#[tokio::test]
async fn exec_with_piped_stdin_and_separate_stderr() {
    let cri = super::shared();
    let (runc, nri) = both(|h| exec_stdin(cri, h)).await;
    expect_value(
        "exec -i (piped stdin)",
        &Streamed {
            stdout: "HELLO WORLD".into(),
            stderr: "to-stderr\n".into(),
            status: "exit 4".into(),
        },
        &runc,
        &nri,
    );
}

/// `kubectl attach -it`: a container started with stdin and a tty runs a
/// shell; an attached client's typed line runs in the container's init.
async fn attach(cri: &Cri, h: &'static str) -> String {
    let (mut c, pod, cfg) = pod(cri, "attach", NS, h, |_| {}).await;
    let mut cc = container("c", &["sh"]);
    cc.stdin = true;
    cc.tty = true;
    let id = running(&mut c, &pod, &cfg, cc).await;
    let url =
        c.rt.attach(api::AttachRequest {
            container_id: id.clone(),
            stdin: true,
            tty: true,
            stdout: true,
            stderr: false,
        })
        .await
        .unwrap_or_else(|e| panic!("Attach to {id}: {e}"))
        .into_inner()
        .url;
    let got = stream(&url, &[(0, b"echo attached-$((1+1)) in $$\n")], Some("attached-2 in 1")).await;
    c.remove_pod(&pod).await;
    got.stdout
        .replace('\r', "")
        .lines()
        .find(|l| l.starts_with("attached-"))
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn attach_to_a_tty_container() {
    let cri = super::shared();
    let (runc, nri) = both(|h| attach(cri, h)).await;
    expect_value("attach -it", &"attached-2 in 1".to_string(), &runc, &nri);
}

/// A pod's `hostPort`: a TCP connection to the node's address at the host
/// port reaches the container's port (CNI portmap, the same for both
/// handlers since the runtime only has to keep the pod's network alive).
async fn host_port(cri: &Cri, h: &'static str, port: u16) -> String {
    let (mut c, pod, cfg) = pod(cri, &format!("hostport-{port}"), NS, h, |p| {
        p.port_mappings = vec![api::PortMapping {
            protocol: api::Protocol::Tcp as i32,
            container_port: 8080,
            host_port: i32::from(port),
            host_ip: String::new(),
        }];
    })
    .await;
    let server = "while true; do echo served-by-container | nc -l -p 8080; done";
    running(&mut c, &pod, &cfg, container("c", &["sh", "-c", server])).await;
    let gw = format!("{}1", cri.subnet.trim_end_matches("0/24"));
    let mut got = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Ok(mut s)) = tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::TcpStream::connect((gw.as_str(), port)),
        )
        .await
        {
            use tokio::io::AsyncReadExt;
            let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_string(&mut got)).await;
            if !got.is_empty() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.remove_pod(&pod).await;
    got
}

#[tokio::test]
async fn host_port_mapping_reaches_the_container() {
    let cri = super::shared();
    let base = 31000 + (std::process::id() % 500) as u16 * 2;
    // One pod after the other, unlike the other comparisons: on a host
    // whose nat table lacks them, CNI portmap creates its chains
    // (CNI-HOSTPORT-SETMARK, ...) at a pod's first port mapping, and two
    // pods set up at once raced there (iptables-nft: "File exists", failing
    // either pod; seen in the fresh cgroup v2 VM).
    let runc = host_port(cri, "runc", base).await;
    let nri = host_port(cri, "nri-shim", base + 1).await;
    expect_value("hostPort 8080", &"served-by-container\n".to_string(), &runc, &nri);
}
