//! The order in which plugins see events, without one lock across a
//! request's whole plugin chain.
//!
//! Every runtime request is *admitted* once: under a short lock it gets a
//! sequence number and, from each plugin it may call, a numbered [`Turn`]
//! ([`Admission::admit`]). A plugin serves its turns one at a time in
//! number order (its [`Turnstile`]), so:
//!
//! * every plugin sees the events it gets in the order the runtime
//!   admitted them, and any two plugins agree on the order of the events
//!   both get;
//! * a plugin has at most one request of the runtime in flight, as with a
//!   runtime that serializes its requests;
//! * different requests are at different plugins at the same time: a
//!   create that waits for plugin 20 does not keep plugin 10 from serving
//!   the next create (a pipeline, not a queue in front of the chain).
//!
//! A turn given up unused (the request failed before it reached that
//! plugin, or the plugin is not to be called) lets the plugin's next turn
//! go without waiting ([`Turn`]'s drop). No cycle can form: a turn waits
//! only for earlier turns of the same plugin (earlier admitted requests,
//! or an earlier step of the same request) and, within one request, for
//! plugins earlier in the invocation order.
//!
//! A plugin that joins takes the first turn of its own turnstile for its
//! Synchronize when it is admitted to the order, so every later request
//! reaches it after its sync, and the join waits until every request
//! admitted before it is finished ([`Admission::settled`]), so its sync
//! state holds what they did (see [`crate::known`]).

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex},
};

use nri_proto::sync::lock;
use tokio::sync::{Notify, oneshot};

/// One plugin's turns.
#[derive(Debug, Default)]
pub(crate) struct Turnstile(Mutex<Stile>);

#[derive(Debug, Default)]
struct Stile {
    /// Number of the next turn to hand out.
    issued: u64,
    /// The turn being served (or about to be).
    serving: u64,
    /// Turns given up before they came up: skipped when they do.
    given_up: BTreeSet<u64>,
    /// The waiter of the turn that comes up next, woken when it does.
    waiting: HashMap<u64, oneshot::Sender<()>>,
}

impl Turnstile {
    /// Hands out the next turn. Call only under the admission lock, so
    /// that all plugins hand out turns to requests in one order.
    pub fn issue(self: &Arc<Self>) -> Turn {
        let mut s = lock(&self.0);
        let n = s.issued;
        s.issued += 1;
        Turn { stile: self.clone(), n }
    }

    /// Turns handed out and not yet finished.
    #[cfg(test)]
    pub fn outstanding(&self) -> u64 {
        let s = lock(&self.0);
        s.issued - s.serving
    }
}

/// A plugin's turn for one step of one request. [`Turn::ready`] waits
/// until it comes up; dropping the turn finishes it (after use) or gives
/// it up (before).
#[derive(Debug)]
pub(crate) struct Turn {
    stile: Arc<Turnstile>,
    n: u64,
}

impl Turn {
    /// Waits until every earlier turn of this plugin is finished or given
    /// up. Cancel-safe: a dropped wait leaves the turn as it was.
    pub async fn ready(&self) {
        let rx = {
            let mut s = lock(&self.stile.0);
            if s.serving == self.n {
                return;
            }
            let (tx, rx) = oneshot::channel();
            s.waiting.insert(self.n, tx);
            rx
        };
        // The sender is dropped only by the turnstile, after it made this
        // turn the one served (or when the whole turnstile goes).
        let _ = rx.await;
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut s = lock(&self.stile.0);
        s.waiting.remove(&self.n);
        if s.serving != self.n {
            s.given_up.insert(self.n);
            return;
        }
        s.serving += 1;
        loop {
            let next = s.serving;
            if s.given_up.remove(&next) {
                s.serving += 1;
                continue;
            }
            if let Some(tx) = s.waiting.remove(&next) {
                let _ = tx.send(());
            }
            break;
        }
    }
}

/// Requests admitted and not yet finished, by sequence number.
#[derive(Debug, Default)]
pub(crate) struct Admission {
    state: Mutex<Admitted>,
    /// Woken when a request finishes.
    finished: Notify,
}

#[derive(Debug, Default)]
struct Admitted {
    next: u64,
    in_flight: BTreeSet<u64>,
}

/// A request from its admission until it is finished (dropped).
#[derive(Debug)]
pub(crate) struct Flight {
    admission: Arc<Admission>,
    seq: u64,
}

impl Drop for Flight {
    fn drop(&mut self) {
        lock(&self.admission.state).in_flight.remove(&self.seq);
        self.admission.finished.notify_waiters();
    }
}

impl Admission {
    /// Admits one request: runs `issue` (which hands out the request's
    /// turns) under the admission lock, so the turns of two requests are in
    /// the same order at every plugin. Keep `issue` short: no awaiting, no
    /// plugin calls.
    pub fn admit<T>(self: &Arc<Self>, issue: impl FnOnce() -> T) -> (Flight, T) {
        let mut s = lock(&self.state);
        let seq = s.next;
        s.next += 1;
        s.in_flight.insert(seq);
        let out = issue();
        drop(s);
        (
            Flight {
                admission: self.clone(),
                seq,
            },
            out,
        )
    }

    /// A barrier (a joining plugin): runs `issue` under the admission lock
    /// like [`Admission::admit`] and returns the sequence number every
    /// request admitted before it has, for [`Admission::settled`].
    pub fn barrier<T>(&self, issue: impl FnOnce() -> T) -> (u64, T) {
        let s = lock(&self.state);
        let before = s.next;
        let out = issue();
        drop(s);
        (before, out)
    }

    /// Waits until every request admitted before `barrier` is finished.
    pub async fn settled(&self, barrier: u64) {
        loop {
            let notified = self.finished.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let pending = lock(&self.state).in_flight.first().is_some_and(|&s| s < barrier);
            if !pending {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn quickly<F: std::future::Future>(f: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(5), f)
            .await
            .expect("did not come up")
    }

    #[tokio::test]
    async fn turns_come_up_in_issue_order_and_given_up_ones_are_skipped() {
        let t = Arc::new(Turnstile::default());
        let (a, b, c, d) = (t.issue(), t.issue(), t.issue(), t.issue());
        // b is given up before its turn: when a finishes, c comes up.
        drop(b);
        let c_ready = tokio::spawn(async move {
            c.ready().await;
            c
        });
        tokio::task::yield_now().await;
        assert!(!c_ready.is_finished(), "c must wait for a");
        a.ready().await;
        drop(a);
        let c = quickly(c_ready).await.unwrap();
        // d waits for c.
        let d_ready = tokio::spawn(async move { d.ready().await });
        tokio::task::yield_now().await;
        assert!(!d_ready.is_finished());
        drop(c);
        quickly(d_ready).await.unwrap();
        assert_eq!(t.outstanding(), 0);
    }

    #[tokio::test]
    async fn a_cancelled_wait_keeps_the_turn_and_dropping_it_passes_it_on() {
        let t = Arc::new(Turnstile::default());
        let (a, b, c) = (t.issue(), t.issue(), t.issue());
        // b's wait is cancelled while a holds the turn.
        assert!(
            tokio::time::timeout(Duration::from_millis(10), b.ready())
                .await
                .is_err()
        );
        drop(a);
        // b is served now (its sender was removed with the cancelled wait).
        quickly(b.ready()).await;
        drop(b);
        quickly(c.ready()).await;
    }

    #[tokio::test]
    async fn settled_waits_for_requests_admitted_before_the_barrier_only() {
        let adm = Arc::new(Admission::default());
        let (first, ()) = adm.admit(|| ());
        let (barrier, ()) = adm.barrier(|| ());
        let (later, ()) = adm.admit(|| ());
        assert!(
            tokio::time::timeout(Duration::from_millis(10), adm.settled(barrier))
                .await
                .is_err(),
            "the earlier request is in flight"
        );
        drop(first);
        quickly(adm.settled(barrier)).await;
        drop(later);
    }
}
