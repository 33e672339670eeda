//! `delete`: what containerd runs after every task delete; idempotent,
//! through the daemon when it answers, else from the bundle's record.

use std::{
    io::Write as _,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::bail;

use super::start::{answers, daemon_dir};
use crate::{
    config::Config, container::bundle::EXIT_STATUS_FILE, container::record::TaskRecord, node::args::Flags,
    task::ttrpc::NAMESPACE_HEADER,
};

/// `delete`: reports the exit status persisted in the bundle (137 when
/// none was recorded) as a protobuf `DeleteResponse` on stdout, after
/// making sure the task is gone. The daemon is asked first (a running task
/// is killed through it); when it is unreachable, fails mid-request, or
/// does not know the task (a daemon started since), the task is removed
/// here from the bundle's record (see [`crate::container::cleanup`]). A
/// bundle without a record has nothing left: the daemon removes the record
/// when it completes the task's delete (see
/// [`crate::container::record::TaskRecord::remove`]), so only a claim
/// `start` may have left is removed. The shim config is read only for a
/// bundle without a record or with an unreadable one, and leniently.
///
/// Must run before any thread is started (it may call libcontainer).
///
/// # Errors
/// When the response cannot be written.
pub fn delete_action(flags: &Flags) -> anyhow::Result<()> {
    let bundle = flags
        .bundle
        .clone()
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_default();
    let record = match TaskRecord::read(&bundle) {
        Ok(Some(r)) => r,
        Ok(None) => {
            // The daemon removes the record once it completed the task's
            // delete, and `start` writes it before containerd can create
            // the task: nothing is left to clean up. (The usual case:
            // containerd runs this after every task delete.) A claim the
            // `start` left without a record goes.
            let dir = daemon_dir(&Config::state_root_lenient(), &flags.address);
            crate::node::claim::consume(&dir, &flags.namespace, &flags.id);
            return respond(&bundle);
        }
        Err(e) => {
            eprintln!("nri-shim delete {}: {}", flags.id, crate::error::chain(&e));
            TaskRecord {
                version: crate::container::record::RECORD_VERSION,
                namespace: flags.namespace.clone(),
                id: flags.id.clone(),
                daemon_dir: daemon_dir(&Config::state_root_lenient(), &flags.address),
            }
        }
    };
    // The task's Create will not come now (a start whose Create failed or
    // never came is cleaned up with this); the daemon need not wait for it.
    crate::node::claim::consume(&record.daemon_dir, &record.namespace, &record.id);
    let sock = record.socket();
    let through_daemon = if answers(&sock) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(delete_through_daemon(&sock, &flags.namespace, &flags.id))
    } else {
        Err(anyhow::anyhow!("daemon socket {} does not answer", sock.display()))
    };
    match through_daemon {
        Ok(true) => {}
        outcome => {
            if let Err(e) = outcome {
                eprintln!(
                    "nri-shim delete {}: {e:#}; cleaning up from {}",
                    flags.id,
                    bundle.join(crate::container::record::RECORD_FILE).display()
                );
            }
            for problem in crate::container::cleanup::clean_up(&record, &bundle) {
                eprintln!("nri-shim delete {}: {}", flags.id, crate::error::chain(&problem));
            }
        }
    }
    respond(&bundle)
}

/// Writes `delete`'s answer: the exit status persisted in `bundle` (137
/// when none was recorded).
fn respond(bundle: &Path) -> anyhow::Result<()> {
    use containerd_shim_protos::{api::DeleteResponse, protobuf::Message};
    let exit_status = std::fs::read_to_string(bundle.join(EXIT_STATUS_FILE))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(137);
    let rsp = DeleteResponse {
        exit_status,
        exited_at: protobuf::MessageField::some(crate::task::service::timestamp(std::time::SystemTime::now())),
        ..Default::default()
    };
    let mut out = std::io::stdout();
    out.write_all(&rsp.write_to_bytes()?)?;
    out.flush()?;
    Ok(())
}

/// Deletes the task through the daemon: `true` when the daemon deleted
/// it, `false` when it does not know it. A task still running is killed
/// first (containerd runs `delete` only for a task it gave up on).
async fn delete_through_daemon(sock: &Path, ns: &str, id: &str) -> anyhow::Result<bool> {
    use containerd_shim_protos::{
        api::{DeleteRequest, KillRequest},
        shim_async::TaskClient,
    };
    let client = ttrpc::asynchronous::Client::connect(&format!("unix://{}", sock.display())).await?;
    let task = TaskClient::new(client);
    let ctx = || {
        let mut ctx = ttrpc::context::with_timeout(Duration::from_secs(30).as_nanos() as i64);
        ctx.add(NAMESPACE_HEADER.to_string(), ns.to_string());
        ctx
    };
    let req = DeleteRequest {
        id: id.to_string(),
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut killed = false;
    loop {
        match task.delete(ctx(), &req).await {
            Ok(_) => return Ok(true),
            Err(ttrpc::Error::RpcStatus(s)) if s.code() == ttrpc::Code::NOT_FOUND => return Ok(false),
            Err(ttrpc::Error::RpcStatus(s)) if s.code() == ttrpc::Code::FAILED_PRECONDITION => {
                if Instant::now() > deadline {
                    bail!("task {id} still running 10s after SIGKILL: {}", s.message());
                }
                if !killed {
                    let kill = KillRequest {
                        id: id.to_string(),
                        signal: libc::SIGKILL as u32,
                        all: true,
                        ..Default::default()
                    };
                    let _ = task.kill(ctx(), &kill).await;
                    killed = true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}
