//! A lane: a thread of its own running a single-threaded runtime, for work
//! that must not queue behind the main runtime's tasks or that should run
//! at another CPU priority. The store has two: the writer's
//! ([`crate::writer`]: a batch's round trips to the database are not
//! served after whatever HTTP/2 connections the runtime's workers are
//! writing pages to) and the background one ([`crate::background`]: the
//! viewers' lists on CPU time no other thread wants).
//!
//! Database connections belong to the runtime that opened them, so work on
//! a lane reads and writes through connections of its own
//! ([`crate::storage::Storage::for_writer`],
//! [`crate::storage::Storage::for_background`]).

use std::future::Future;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How the kernel schedules a lane's thread. On Linux both the policy and
/// the nice value are the thread's, not the process's, and the threads it
/// starts inherit them; lowering one's priority needs no privilege.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// As the process's other threads.
    Normal,
    /// `SCHED_IDLE`: the thread runs on CPU time no other thread wants, and
    /// a thread of the normal policy that wakes up takes the CPU from it at
    /// once. A raised nice value only shrinks its share: the kernel may let
    /// it finish its slice (up to milliseconds) before a woken thread runs.
    /// Where the kernel refuses the policy (a seccomp filter), the thread
    /// runs at `fallback_nice`; it is set in either case, so `ps` shows it.
    Idle { fallback_nice: i32 },
}

/// A named thread running a single-threaded runtime, stopped when dropped
/// (its unfinished tasks are dropped with it).
#[derive(Debug)]
pub struct Lane {
    handle: tokio::runtime::Handle,
    _stop: oneshot::Sender<()>,
}

/// Applies `priority` to the calling thread, logging what the kernel
/// refused (the work then runs at a higher priority than asked, never
/// not at all).
pub(crate) fn lower_priority(thread: &str, priority: Priority) {
    let Priority::Idle { fallback_nice: nice } = priority else { return };
    use thread_priority::{NormalThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy};
    let idle = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle);
    let native = thread_priority::thread_native_id();
    // Sets the policy, then a nice value of 0, which the line below raises.
    // The second step fails without privilege in a process started at a
    // positive nice value, after the policy took: only the policy counts.
    let set = thread_priority::set_thread_priority_and_policy(native, ThreadPriority::Min, idle);
    if let Err(error) = set {
        if thread_priority::thread_schedule_policy().ok() != Some(idle) {
            tracing::warn!(%error, thread, nice, "cannot schedule the thread as SCHED_IDLE; it runs at its nice value");
        }
    }
    if let Err(error) = rustix::process::setpriority_process(None, nice) {
        tracing::warn!(%error, thread, nice, "cannot set the thread's nice value");
    }
}

impl Lane {
    /// Starts the thread `name` at `priority`.
    pub fn start(name: &str, priority: Priority) -> std::io::Result<Lane> {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = name.to_string();
        std::thread::Builder::new().name(thread.clone()).spawn(move || {
            lower_priority(&thread, priority);
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(error) => {
                    let _ = handle_tx.send(Err(error));
                    return;
                }
            };
            let _ = handle_tx.send(Ok(runtime.handle().clone()));
            runtime.block_on(async {
                let _ = stopped.await;
            });
        })?;
        let handle = handle_rx
            .recv()
            .map_err(|_| std::io::Error::other(format!("the thread {name} ended at start")))??;
        Ok(Lane { handle, _stop: stop })
    }

    /// Runs `task` on the lane.
    pub fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(task)
    }
}
