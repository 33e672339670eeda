//! Task events to containerd, in order.
//!
//! One queue, one forwarding task: an event is forwarded (with retries)
//! before the next is looked at, so containerd sees `/tasks/create` before
//! `/tasks/start` before `/tasks/exit` (containerd #7111, #9719). The
//! upstream Rust publisher re-queues failed events behind newer ones; this
//! one does not.
//!
//! While containerd is away (restarting), events wait in a queue of at
//! most [`QUEUE_BOUND`] and the head is retried until containerd answers
//! again (backoff up to 1 s): an exit that happens while containerd
//! restarts reaches the new containerd, in order. Only a queue that
//! overflows loses events, the oldest first, each drop logged.

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

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

    /// Events published and not yet delivered (an upgrade waits for none).
    fn pending(&self) -> usize {
        0
    }
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
    pending: Arc<AtomicUsize>,
}

impl RemotePublisher {
    /// A publisher to `address` (containerd's `TTRPC_ADDRESS`). Connects
    /// lazily and reconnects after failures.
    pub fn new(address: String) -> RemotePublisher {
        let (tx, rx) = mpsc::unbounded_channel();
        let pending = Arc::new(AtomicUsize::new(0));
        tokio::spawn(forward_loop(address, rx, pending.clone()));
        RemotePublisher { tx, pending }
    }
}

impl EventSink for RemotePublisher {
    fn publish(&self, namespace: &str, topic: &'static str, event: Box<dyn MessageDyn>) {
        let mut env = Envelope::new();
        env.timestamp = protobuf::MessageField::some(crate::task::service::timestamp(std::time::SystemTime::now()));
        env.namespace = namespace.to_string();
        env.topic = topic.to_string();
        env.event = protobuf::MessageField::some(to_any(&*event));
        self.pending.fetch_add(1, Ordering::SeqCst);
        if self.tx.send(env).is_err() {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            tracing::error!(topic, "event queue closed, event dropped");
        }
    }

    fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
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
            tracing::debug!(address, error = %crate::error::chain(&e), "cannot connect to containerd's events service");
            None
        }
    }
}

/// Most events kept for containerd while it cannot be reached: about a
/// minute of a busy node's lifecycle events (each is well under 1 KiB).
pub const QUEUE_BOUND: usize = 4096;

/// Longest pause between two attempts at the queue's head.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Events not yet delivered, oldest first, at most `bound`.
pub struct Backlog<T> {
    items: VecDeque<T>,
    bound: usize,
    dropped: u64,
}

impl<T> Backlog<T> {
    /// An empty backlog keeping at most `bound` items.
    pub fn new(bound: usize) -> Backlog<T> {
        Backlog {
            items: VecDeque::new(),
            bound: bound.max(1),
            dropped: 0,
        }
    }

    /// Appends `item`; when full, the oldest item is dropped and returned.
    pub fn push(&mut self, item: T) -> Option<T> {
        let dropped = if self.items.len() >= self.bound {
            self.dropped += 1;
            self.items.pop_front()
        } else {
            None
        };
        self.items.push_back(item);
        dropped
    }

    /// The oldest item.
    pub fn front(&self) -> Option<&T> {
        self.items.front()
    }

    /// Removes the oldest item (delivered).
    pub fn pop(&mut self) -> Option<T> {
        self.items.pop_front()
    }

    /// Items waiting.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Nothing waiting.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Items dropped because the backlog was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

async fn forward(client: &EventsClient, env: &Envelope) -> Result<(), ttrpc::Error> {
    let req = ForwardRequest {
        envelope: protobuf::MessageField::some(env.clone()),
        ..Default::default()
    };
    let mut ctx = ttrpc::context::with_timeout(Duration::from_secs(5).as_nanos() as i64);
    ctx.add("containerd-namespace-ttrpc".to_string(), env.namespace.clone());
    client.forward(ctx, &req).await.map(|_| ())
}

fn take(backlog: &mut Backlog<Envelope>, env: Envelope, pending: &AtomicUsize) {
    if let Some(old) = backlog.push(env) {
        pending.fetch_sub(1, Ordering::SeqCst);
        tracing::error!(
            topic = %old.topic,
            bound = QUEUE_BOUND,
            dropped = backlog.dropped(),
            "containerd unreachable and the event queue is full: oldest event dropped"
        );
    }
}

async fn forward_loop(address: String, mut rx: mpsc::UnboundedReceiver<Envelope>, pending: Arc<AtomicUsize>) {
    let mut client: Option<EventsClient> = None;
    let mut backlog = Backlog::new(QUEUE_BOUND);
    let mut failures = 0u32;
    loop {
        if backlog.is_empty() {
            match rx.recv().await {
                Some(env) => take(&mut backlog, env, &pending),
                None => return,
            }
        }
        while let Ok(env) = rx.try_recv() {
            take(&mut backlog, env, &pending);
        }
        let Some(env) = backlog.front() else { continue };
        if client.is_none() {
            client = connect(&address).await;
        }
        let result = match &client {
            Some(c) => forward(c, env).await.map_err(|e| e.to_string()),
            None => Err("not connected".to_string()),
        };
        match result {
            Ok(()) => {
                if failures > 0 {
                    tracing::info!(topic = %env.topic, attempts = failures + 1, waiting = backlog.len() - 1, "containerd reachable again, event delivered");
                }
                failures = 0;
                backlog.pop();
                pending.fetch_sub(1, Ordering::SeqCst);
            }
            Err(e) => {
                client = None;
                if failures == 0 {
                    tracing::warn!(topic = %env.topic, error = %e, "forwarding event failed; keeping it (and those after it) until containerd answers");
                }
                failures += 1;
                let pause = Duration::from_millis(50u64 << failures.min(5)).min(MAX_BACKOFF);
                // Keep taking new events while waiting: the bound applies.
                let sleep = tokio::time::sleep(pause);
                tokio::pin!(sleep);
                loop {
                    tokio::select! {
                        _ = &mut sleep => break,
                        next = rx.recv() => match next {
                            Some(env) => take(&mut backlog, env, &pending),
                            None => break,
                        },
                    }
                }
            }
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
        self.wait_topic_for(topic, Duration::from_secs(10)).await
    }

    /// Waits until an event with `topic` exists, at most `within`.
    pub async fn wait_topic_for(&self, topic: &str, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
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

    struct Recorder(Mutex<Vec<u32>>);

    #[async_trait::async_trait]
    impl containerd_shim_protos::shim_async::Events for Recorder {
        async fn forward(
            &self,
            _ctx: &ttrpc::r#async::TtrpcContext,
            req: ForwardRequest,
        ) -> ttrpc::Result<protobuf::well_known_types::empty::Empty> {
            let m = <ev::TaskStart as protobuf::Message>::parse_from_bytes(&req.envelope.event.value).unwrap();
            self.0.lock().unwrap().push(m.pid);
            Ok(Default::default())
        }
    }

    #[tokio::test]
    async fn events_wait_for_containerd_to_come_back_and_arrive_in_order() {
        let d = tempfile::tempdir().unwrap();
        let sock = d.path().join("containerd.sock.ttrpc");
        let publisher = RemotePublisher::new(sock.display().to_string());
        for pid in 1..=3 {
            let e = ev::TaskStart {
                container_id: "c1".into(),
                pid,
                ..Default::default()
            };
            publisher.publish("default", topics::START, Box::new(e));
        }
        // containerd is away longer than any fixed number of retries lasts.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let seen = std::sync::Arc::new(Recorder(Mutex::new(Vec::new())));
        let mut server = ttrpc::asynchronous::Server::new()
            .bind(&format!("unix://{}", sock.display()))
            .unwrap()
            .register_service(containerd_shim_protos::shim_async::create_events(seen.clone()));
        server.start().await.unwrap();
        publisher.publish(
            "default",
            topics::START,
            Box::new(ev::TaskStart {
                pid: 4,
                ..Default::default()
            }),
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while seen.0.lock().unwrap().len() < 4 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(*seen.0.lock().unwrap(), vec![1, 2, 3, 4]);
        let _ = server.shutdown().await;
    }

    #[test]
    fn backlog_keeps_order_and_drops_the_oldest_beyond_its_bound() {
        let mut b = Backlog::new(3);
        for i in 0..3 {
            assert_eq!(b.push(i), None);
        }
        assert_eq!(b.push(3), Some(0));
        assert_eq!((b.len(), b.dropped()), (3, 1));
        assert_eq!(b.front(), Some(&1));
        assert_eq!((b.pop(), b.pop(), b.pop(), b.pop()), (Some(1), Some(2), Some(3), None));
        assert!(b.is_empty());
    }

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
