//! Task events to containerd, in order.
//!
//! One queue, one forwarding task: an event is forwarded (with retries)
//! before the next is looked at, so containerd sees `/tasks/create` before
//! `/tasks/start` before `/tasks/exit` (containerd #7111, #9719). The
//! upstream Rust publisher re-queues failed events behind newer ones; this
//! one does not.

use std::{sync::Mutex, time::Duration};

use containerd_shim_protos::{
    events::task as ev,
    protobuf::{MessageDyn, well_known_types::any::Any},
    shim::event::Envelope,
    shim::events::ForwardRequest,
    shim_async::EventsClient,
};
use tokio::sync::mpsc;

/// containerd topic names.
pub mod topics {
    /// Task created.
    pub const CREATE: &str = "/tasks/create";
    /// Task started.
    pub const START: &str = "/tasks/start";
    /// A process exited.
    pub const EXIT: &str = "/tasks/exit";
    /// Task deleted.
    pub const DELETE: &str = "/tasks/delete";
    /// Exec process added.
    pub const EXEC_ADDED: &str = "/tasks/exec-added";
    /// Exec process started.
    pub const EXEC_STARTED: &str = "/tasks/exec-started";
    /// Task paused.
    pub const PAUSED: &str = "/tasks/paused";
    /// Task resumed.
    pub const RESUMED: &str = "/tasks/resumed";
    /// Task hit its memory limit.
    pub const OOM: &str = "/tasks/oom";
}

/// Where task events go (containerd, or a test channel).
pub trait EventSink: Send + Sync + 'static {
    /// Queues an event; never blocks.
    fn publish(&self, namespace: &str, topic: &'static str, event: Box<dyn MessageDyn>);
}

/// The `Any` containerd's typeurl expects: the message's full proto name.
pub fn to_any(event: &dyn MessageDyn) -> Any {
    let mut any = Any::new();
    any.type_url = event.descriptor_dyn().full_name().to_string();
    any.value = event.write_to_bytes_dyn().unwrap_or_default();
    any
}

/// Forwards events to containerd's ttrpc events service.
pub struct RemotePublisher {
    tx: mpsc::UnboundedSender<Envelope>,
}

impl RemotePublisher {
    /// A publisher to `address` (containerd's `TTRPC_ADDRESS`). Connects
    /// lazily and reconnects after failures.
    pub fn new(address: String) -> RemotePublisher {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(forward_loop(address, rx));
        RemotePublisher { tx }
    }
}

impl EventSink for RemotePublisher {
    fn publish(&self, namespace: &str, topic: &'static str, event: Box<dyn MessageDyn>) {
        let mut env = Envelope::new();
        env.timestamp = protobuf::MessageField::some(crate::service::timestamp(std::time::SystemTime::now()));
        env.namespace = namespace.to_string();
        env.topic = topic.to_string();
        env.event = protobuf::MessageField::some(to_any(&*event));
        if self.tx.send(env).is_err() {
            tracing::error!(topic, "event queue closed, event dropped");
        }
    }
}

async fn connect(address: &str) -> Option<EventsClient> {
    let addr = if address.contains("://") {
        address.to_string()
    } else {
        format!("unix://{address}")
    };
    match ttrpc::asynchronous::Client::connect(&addr).await {
        Ok(c) => Some(EventsClient::new(c)),
        Err(e) => {
            tracing::warn!(address, error = %e, "cannot connect to containerd's events service");
            None
        }
    }
}

async fn forward_loop(address: String, mut rx: mpsc::UnboundedReceiver<Envelope>) {
    let mut client: Option<EventsClient> = None;
    while let Some(env) = rx.recv().await {
        let req = ForwardRequest {
            envelope: protobuf::MessageField::some(env),
            ..Default::default()
        };
        let mut delivered = false;
        for attempt in 0..5u32 {
            if client.is_none() {
                client = connect(&address).await;
            }
            if let Some(c) = &client {
                let mut ctx = ttrpc::context::with_timeout(Duration::from_secs(5).as_nanos() as i64);
                ctx.add("containerd-namespace-ttrpc".to_string(), req.envelope.namespace.clone());
                match c.forward(ctx, &req).await {
                    Ok(_) => {
                        delivered = true;
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(topic = %req.envelope.topic, attempt, error = %e, "forwarding event failed");
                        client = None;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
        }
        if !delivered {
            tracing::error!(topic = %req.envelope.topic, "event dropped after retries");
        }
    }
}

/// Collects events in memory (tests, and runs without containerd).
#[derive(Default)]
pub struct MemorySink {
    events: Mutex<Vec<(String, &'static str, Any)>>,
    notify: tokio::sync::Notify,
}

impl MemorySink {
    /// The topics seen so far, in order.
    pub fn topics(&self) -> Vec<&'static str> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|e| e.1)
            .collect()
    }

    /// Every event so far: (namespace, topic, payload).
    pub fn events(&self) -> Vec<(String, &'static str, Any)> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until an event with `topic` exists (10 s deadline).
    pub async fn wait_topic(&self, topic: &str) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.topics().contains(&topic) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    /// The TaskExit events' (id, exit_status), in order.
    pub fn exits(&self) -> Vec<(String, u32)> {
        self.events()
            .into_iter()
            .filter(|e| e.1 == topics::EXIT)
            .filter_map(|e| {
                let m = <ev::TaskExit as protobuf::Message>::parse_from_bytes(&e.2.value).ok()?;
                Some((m.id, m.exit_status))
            })
            .collect()
    }
}

impl EventSink for MemorySink {
    fn publish(&self, namespace: &str, topic: &'static str, event: Box<dyn MessageDyn>) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((namespace.to_string(), topic, to_any(&*event)));
        self.notify.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_carries_the_full_type_name() {
        let e = ev::TaskStart {
            container_id: "c1".into(),
            pid: 7,
            ..Default::default()
        };
        let any = to_any(&e);
        assert_eq!(any.type_url, "containerd.events.TaskStart");
        let back = <ev::TaskStart as protobuf::Message>::parse_from_bytes(&any.value).unwrap();
        assert_eq!(back.pid, 7);
    }
}
