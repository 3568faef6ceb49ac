//! A lane: a thread of its own running a single-threaded runtime, for work
//! that must not queue behind the main runtime's tasks or that should run
//! at another CPU priority. The store has two: the writer's
//! ([`crate::writer`]: a batch's round trips to the database are not
//! served after whatever HTTP/2 connections the runtime's workers are
//! writing pages to) and the background one ([`crate::background`]: the
//! viewers' lists at a raised nice value).
//!
//! Database connections belong to the runtime that opened them, so work on
//! a lane reads and writes through connections of its own
//! ([`crate::storage::Storage::for_writer`],
//! [`crate::storage::Storage::for_background`]).

use std::future::Future;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A named thread running a single-threaded runtime, stopped when dropped
/// (its unfinished tasks are dropped with it).
#[derive(Debug)]
pub struct Lane {
    handle: tokio::runtime::Handle,
    _stop: oneshot::Sender<()>,
}

impl Lane {
    /// Starts the thread `name`, at nice value `nice` when given (on Linux
    /// the nice value is the thread's, not the process's; lowering one's
    /// priority needs no privilege).
    pub fn start(name: &str, nice: Option<i32>) -> std::io::Result<Lane> {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = name.to_string();
        std::thread::Builder::new().name(thread.clone()).spawn(move || {
            if let Some(nice) = nice {
                if let Err(error) = rustix::process::setpriority_process(None, nice) {
                    tracing::warn!(%error, thread, nice, "cannot set the thread's priority; its work runs at the process's");
                }
            }
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
