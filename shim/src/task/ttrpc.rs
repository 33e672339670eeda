//! The containerd `Task` ttrpc service: a thin adapter translating each
//! request into a [`Service`] call. It is registered under both
//! `containerd.task.v2.Task` (containerd 1.6/1.7) and `containerd.task.v3.Task`
//! (containerd 2.x; a renamed copy of v2 with the same messages).
//!
//! A panic while serving one request becomes an error reply for that
//! request; the daemon and every other task keep running.
//!
//! The service is served from the daemon's control thread (see
//! [`crate::node::control`]): State, Pids, Stats, ResizePty, Wait,
//! Connect and Shutdown are answered there; every other call runs on the
//! daemon's main runtime and is awaited from there.

use std::{collections::HashMap, panic::AssertUnwindSafe, sync::Arc};

use async_trait::async_trait;
use containerd_shim_protos::{
    api::{self as task_api, Empty},
    shim_async::{Task, create_task},
};
use futures::FutureExt as _;
use ttrpc::asynchronous::TtrpcContext;

use crate::{error::ShimError, task::service::Service};

/// ttrpc metadata key carrying the containerd namespace of a request.
pub const NAMESPACE_HEADER: &str = "containerd-namespace-ttrpc";

/// The ttrpc adapter.
pub struct TaskService {
    service: Service,
    default_ns: String,
    shutdown: Arc<tokio::sync::Notify>,
    /// The daemon's main runtime, where calls that do the daemon's work
    /// run; `None`: they run where the call is served.
    main: Option<tokio::runtime::Handle>,
}

impl TaskService {
    /// Serves `service`; requests without a namespace header belong to
    /// `default_ns`; calls that do work run on `main` when given.
    pub fn new(
        service: Service,
        default_ns: String,
        shutdown: Arc<tokio::sync::Notify>,
        main: Option<tokio::runtime::Handle>,
    ) -> TaskService {
        TaskService {
            service,
            default_ns,
            shutdown,
            main,
        }
    }

    /// Runs request `what` of task `id` as [`TaskService::guarded`] does,
    /// on the main runtime (NRI, libcontainer and exits live there); the
    /// control thread only waits for its answer.
    async fn on_main<T, F>(&self, what: &'static str, id: String, fut: F) -> ttrpc::Result<T>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, ShimError>> + Send + 'static,
    {
        let _busy = self.service.begin_request();
        self.run_main(what, async move {
            crate::waits::request(what, &id, guarded(what, fut)).await
        })
        .await
    }

    /// Runs one request `what` for task `id` where it is served (the
    /// control thread): counted as in flight (the daemon does not exit on
    /// idle under it), panic-guarded, and logged at warn with what it
    /// waited on when it took a second or more ([`crate::waits::request`];
    /// not Wait, which lasts until the exit).
    async fn guarded<T>(
        &self,
        what: &'static str,
        id: &str,
        fut: impl std::future::Future<Output = Result<T, ShimError>>,
    ) -> ttrpc::Result<T> {
        let _busy = self.service.begin_request();
        if what == "Wait" {
            guarded(what, fut).await
        } else {
            crate::waits::request(what, id, guarded(what, fut)).await
        }
    }

    /// Runs `work` (call `what`) on the main runtime and waits for it.
    async fn run_main<T, F>(&self, what: &'static str, work: F) -> ttrpc::Result<T>
    where
        T: Send + 'static,
        F: std::future::Future<Output = ttrpc::Result<T>> + Send + 'static,
    {
        match &self.main {
            None => work.await,
            Some(main) => main.spawn(work).await.unwrap_or_else(|e| {
                Err(ttrpc::Error::RpcStatus(ttrpc::get_status(
                    ttrpc::Code::INTERNAL,
                    format!("{what} ended: {e}"),
                )))
            }),
        }
    }

    fn ns(&self, ctx: &TtrpcContext) -> String {
        ctx.metadata
            .get(NAMESPACE_HEADER)
            .and_then(|v| v.first())
            .filter(|v| !v.is_empty())
            .cloned()
            .unwrap_or_else(|| self.default_ns.clone())
    }
}

/// The service map for a ttrpc server: the same handlers under the task
/// v2 and v3 service names.
pub fn services(task: Arc<TaskService>) -> HashMap<String, ttrpc::asynchronous::Service> {
    let mut map = create_task(task.clone());
    for (name, svc) in create_task(task) {
        map.insert(name.replace(".v3.", ".v2."), svc);
    }
    map
}

/// Runs `f`, turning a panic into an `Internal` status.
async fn guarded<T>(what: &str, f: impl Future<Output = Result<T, ShimError>>) -> ttrpc::Result<T> {
    match AssertUnwindSafe(f).catch_unwind().await {
        Ok(r) => r.map_err(|e| {
            tracing::debug!(request = what, error = %crate::error::chain(&e), "task request failed");
            e.into()
        }),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(request = what, panic = %msg, "task request panicked");
            Err(ttrpc::Error::RpcStatus(ttrpc::get_status(
                ttrpc::Code::INTERNAL,
                format!("{what} panicked: {msg}"),
            )))
        }
    }
}

#[async_trait]
impl Task for TaskService {
    async fn create(
        &self,
        ctx: &TtrpcContext,
        req: task_api::CreateTaskRequest,
    ) -> ttrpc::Result<task_api::CreateTaskResponse> {
        if req.checkpoint.is_empty() && req.parent_checkpoint.is_empty() {
            let (svc, ns) = (self.service.clone(), self.ns(ctx));
            // Boxed: the create's state (a spec and its adjusted copy held
            // across awaits) would otherwise be built and moved on the
            // control thread's stack, which a debug build overflowed.
            self.on_main(
                "Create",
                req.id.clone(),
                async move { Box::pin(svc.create(&ns, req)).await },
            )
            .await
        } else {
            Err(ShimError::Unimplemented("restoring from a checkpoint is not supported by nri-shim".into()).into())
        }
    }

    async fn start(&self, ctx: &TtrpcContext, req: task_api::StartRequest) -> ttrpc::Result<task_api::StartResponse> {
        let (svc, ns) = (self.service.clone(), self.ns(ctx));
        self.on_main("Start", req.id.clone(), async move {
            svc.start(&ns, &req.id, &req.exec_id).await
        })
        .await
    }

    async fn delete(
        &self,
        ctx: &TtrpcContext,
        req: task_api::DeleteRequest,
    ) -> ttrpc::Result<task_api::DeleteResponse> {
        let (svc, ns) = (self.service.clone(), self.ns(ctx));
        self.on_main("Delete", req.id.clone(), async move {
            svc.delete(&ns, &req.id, &req.exec_id).await
        })
        .await
    }

    async fn kill(&self, ctx: &TtrpcContext, req: task_api::KillRequest) -> ttrpc::Result<Empty> {
        let (svc, ns) = (self.service.clone(), self.ns(ctx));
        self.run_main("Kill", async move {
            guarded("Kill", svc.kill(&ns, &req.id, &req.exec_id, req.signal, req.all)).await
        })
        .await?;
        Ok(Empty::new())
    }

    async fn wait(&self, ctx: &TtrpcContext, req: task_api::WaitRequest) -> ttrpc::Result<task_api::WaitResponse> {
        let _waiting = self.service.begin_wait();
        self.guarded("Wait", &req.id, self.service.wait(&self.ns(ctx), &req.id, &req.exec_id))
            .await
    }

    async fn state(&self, ctx: &TtrpcContext, req: task_api::StateRequest) -> ttrpc::Result<task_api::StateResponse> {
        self.guarded(
            "State",
            &req.id,
            self.service.state(&self.ns(ctx), &req.id, &req.exec_id),
        )
        .await
    }

    async fn pids(&self, ctx: &TtrpcContext, req: task_api::PidsRequest) -> ttrpc::Result<task_api::PidsResponse> {
        let pids = self
            .guarded("Pids", &req.id, self.service.pids(&self.ns(ctx), &req.id))
            .await?;
        Ok(task_api::PidsResponse {
            processes: pids
                .into_iter()
                .map(|pid| containerd_shim_protos::types::task::ProcessInfo {
                    pid,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
    }

    async fn pause(&self, ctx: &TtrpcContext, req: task_api::PauseRequest) -> ttrpc::Result<Empty> {
        let (svc, ns) = (self.service.clone(), self.ns(ctx));
        self.on_main(
            "Pause",
            req.id.clone(),
            async move { svc.pause(&ns, &req.id, true).await },
        )
        .await?;
        Ok(Empty::new())
    }

    async fn resume(&self, ctx: &TtrpcContext, req: task_api::ResumeRequest) -> ttrpc::Result<Empty> {
        let (svc, ns) = (self.service.clone(), self.ns(ctx));
        self.on_main(
            "Resume",
            req.id.clone(),
            async move { svc.pause(&ns, &req.id, false).await },
        )
        .await?;
        Ok(Empty::new())
    }

    async fn checkpoint(&self, _ctx: &TtrpcContext, _req: task_api::CheckpointTaskRequest) -> ttrpc::Result<Empty> {
        Err(ShimError::Unimplemented(
            "checkpoint is not supported by nri-shim (libcontainer has no CRIU support here)".into(),
        )
        .into())
    }

    async fn exec(&self, ctx: &TtrpcContext, req: task_api::ExecProcessRequest) -> ttrpc::Result<Empty> {
        let (svc, ns) = (self.service.clone(), self.ns(ctx));
        self.on_main("Exec", req.id.clone(), async move { svc.exec(&ns, req).await })
            .await?;
        Ok(Empty::new())
    }

    async fn resize_pty(&self, ctx: &TtrpcContext, req: task_api::ResizePtyRequest) -> ttrpc::Result<Empty> {
        guarded(
            "ResizePty",
            self.service
                .resize_pty(&self.ns(ctx), &req.id, &req.exec_id, req.width, req.height),
        )
        .await?;
        Ok(Empty::new())
    }

    async fn close_io(&self, ctx: &TtrpcContext, req: task_api::CloseIORequest) -> ttrpc::Result<Empty> {
        let (svc, ns) = (self.service.clone(), self.ns(ctx));
        self.on_main("CloseIO", req.id.clone(), async move {
            svc.close_io(&ns, &req.id, &req.exec_id).await
        })
        .await?;
        Ok(Empty::new())
    }

    async fn update(&self, ctx: &TtrpcContext, req: task_api::UpdateTaskRequest) -> ttrpc::Result<Empty> {
        let (svc, ns) = (self.service.clone(), self.ns(ctx));
        self.on_main("Update", req.id.clone(), async move { svc.update(&ns, req).await })
            .await?;
        Ok(Empty::new())
    }

    async fn stats(&self, ctx: &TtrpcContext, req: task_api::StatsRequest) -> ttrpc::Result<task_api::StatsResponse> {
        self.guarded("Stats", &req.id, self.service.stats(&self.ns(ctx), &req.id))
            .await
    }

    async fn connect(
        &self,
        ctx: &TtrpcContext,
        req: task_api::ConnectRequest,
    ) -> ttrpc::Result<task_api::ConnectResponse> {
        self.guarded("Connect", &req.id, self.service.connect(&self.ns(ctx), &req.id))
            .await
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: task_api::ShutdownRequest) -> ttrpc::Result<Empty> {
        // One daemon serves every task: containerd's Shutdown for one task
        // only lets the daemon consider exiting once it is idle.
        self.shutdown.notify_waiters();
        Ok(Empty::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_request_becomes_internal_and_the_next_one_runs() {
        let e = guarded::<()>("Kill", async { panic!("boom in kill") })
            .await
            .unwrap_err();
        match e {
            ttrpc::Error::RpcStatus(s) => {
                assert_eq!(s.code(), ttrpc::Code::INTERNAL);
                assert!(s.message().contains("Kill panicked: boom in kill"), "{}", s.message());
            }
            other => panic!("not a status: {other:?}"),
        }
        let e = guarded::<()>("Kill", async { Err(ShimError::NotFound("gone".into())) })
            .await
            .unwrap_err();
        assert!(matches!(e, ttrpc::Error::RpcStatus(s) if s.code() == ttrpc::Code::NOT_FOUND));
        assert_eq!(guarded("State", async { Ok(7) }).await.unwrap(), 7);
    }
}
