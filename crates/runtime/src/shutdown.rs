//! One way to stop a process: a [`Shutdown`] that is triggered once (by a
//! signal, by the future a caller hands in, or by a test) and that any
//! number of tasks wait on; and the one signal handler every gantry
//! process uses ([`signal`]).
//!
//! ```text
//! SIGTERM / Ctrl-C ─► signal() ─┐
//! caller's future ──────────────┼─► Shutdown::trigger ─► every wait() completes
//! a test ───────────────────────┘
//! ```
//!
//! Modelled on mini-redis' `shutdown.rs`: a `tokio::sync::watch` channel
//! carries the one bit, so a task that starts waiting after the trigger
//! returns at once, and clones are cheap. Draining is kubert's and
//! mini-redis' `shutdown_complete`: every background task started with
//! [`Shutdown::spawn`] holds a [`DrainGuard`], and [`Shutdown::drained`]
//! completes once every guard is gone, so a process waits for its tasks
//! without keeping their handles.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;

/// A process' shutdown: cloned into every task that must stop with it.
#[derive(Debug, Clone)]
pub struct Shutdown {
    sender: Arc<watch::Sender<bool>>,
    receiver: watch::Receiver<bool>,
    /// Its receivers are the drain guards; closed once none is left.
    drain: Arc<watch::Sender<()>>,
}

/// Held by a task the process waits for before it exits (see
/// [`Shutdown::drained`]); dropping it says the task is done.
#[derive(Debug)]
pub struct DrainGuard {
    _held: watch::Receiver<()>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// A shutdown not triggered yet.
    pub fn new() -> Self {
        let (sender, receiver) = watch::channel(false);
        let (drain, _) = watch::channel(());
        Self { sender: Arc::new(sender), receiver, drain: Arc::new(drain) }
    }

    /// A shutdown triggered when `future` completes (a server's caller
    /// hands in its stop condition this way; the task ends with it).
    pub fn on(future: impl Future<Output = ()> + Send + 'static) -> Self {
        let shutdown = Self::new();
        let trigger = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = future => trigger.trigger(),
                // Triggered some other way: nothing left to wait for.
                () = trigger.wait() => {}
            }
        });
        shutdown
    }

    /// Tells every waiter to stop; later calls change nothing.
    pub fn trigger(&self) {
        self.sender.send_replace(true);
    }

    /// Whether [`Self::trigger`] was called.
    pub fn is_triggered(&self) -> bool {
        *self.receiver.borrow()
    }

    /// Completes once triggered (at once if it already was).
    pub fn wait(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut receiver = self.receiver.clone();
        async move {
            // Err: every sender is gone, which cannot happen while `self`
            // lives; treated as triggered all the same.
            let _ = receiver.wait_for(|stop| *stop).await;
        }
    }
}

impl Shutdown {
    /// A guard the process waits for in [`Shutdown::drained`].
    pub fn guard(&self) -> DrainGuard {
        DrainGuard { _held: self.drain.subscribe() }
    }

    /// Spawns `task` holding a guard until it ends.
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let guard = self.guard();
        tokio::spawn(async move {
            let output = task.await;
            drop(guard);
            output
        })
    }

    /// Completes once every [`DrainGuard`] is dropped (at once if none
    /// was taken).
    pub async fn drained(&self) {
        self.drain.closed().await;
    }
}

/// Completes on SIGTERM or Ctrl-C (SIGINT): the one signal handler of every
/// gantry process.
pub async fn signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
    tracing::info!("shutdown signal received");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn every_waiter_stops_once_and_late_waiters_return_at_once() {
        let shutdown = Shutdown::new();
        let early = tokio::spawn(shutdown.clone().wait());
        tokio::task::yield_now().await;
        assert!(!early.is_finished() && !shutdown.is_triggered());
        shutdown.trigger();
        early.await.expect("the early waiter stops");
        assert!(shutdown.is_triggered());
        // A waiter that starts after the trigger, and a second trigger.
        shutdown.trigger();
        shutdown.wait().await;
    }

    #[tokio::test(start_paused = true)]
    async fn drained_waits_for_every_guarded_task_and_only_for_them() {
        let shutdown = Shutdown::new();
        shutdown.drained().await; // none taken: at once
        let (finish, finished) = tokio::sync::oneshot::channel::<()>();
        let stopping = shutdown.clone();
        shutdown.spawn(async move { stopping.wait().await });
        shutdown.spawn(async move {
            let _ = finished.await;
        });
        let drained = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { shutdown.drained().await }
        });
        shutdown.trigger();
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        assert!(!drained.is_finished(), "drained while a guarded task still ran");
        finish.send(()).unwrap();
        drained.await.expect("drained once both tasks ended");
    }

    #[tokio::test(start_paused = true)]
    async fn a_shutdown_on_a_future_is_triggered_when_it_completes() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let shutdown = Shutdown::on(async move {
            let _ = rx.await;
        });
        tokio::task::yield_now().await;
        assert!(!shutdown.is_triggered());
        tx.send(()).expect("the future waits");
        shutdown.wait().await;
        assert!(shutdown.is_triggered());
    }
}
