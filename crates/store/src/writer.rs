//! Group commit: one task takes every queued write, runs them in one
//! transaction, and answers each after the commit. Throughput is then not
//! bounded by one durable commit per write, yet every write is acknowledged
//! only once it is on disk, and a write refused by its rule fails alone.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, oneshot};

use crate::awake::Awake;
use crate::storage::{Committed, Mutation, PendingWrite, Storage, StorageError};
use crate::watch::hub::WatchHub;

/// The name of the thread the writer runs on ([`crate::lane`]).
pub const THREAD: &str = "gantry-writer";

/// Most writes in one transaction.
pub const MAX_BATCH: usize = 256;
/// Watchers woken before a batch's answers, at most; with more, they are
/// woken after (docs/benchmarks.md, "The writer answers before it wakes
/// the watchers": 2–6 µs of fan-out a watcher against 0.1–0.2 ms of
/// answering a batch).
const FEW_WATCHERS: usize = 32;
/// Writes waiting for the writer before callers wait to enqueue.
const QUEUE: usize = 4096;

struct Job {
    write: PendingWrite,
    reply: oneshot::Sender<Result<Committed, StorageError>>,
}

/// Handle to the writer task.
#[derive(Debug, Clone)]
pub struct Writer {
    queue: mpsc::Sender<Job>,
    /// Told of each write from its queueing to its answer.
    awake: Option<Arc<Awake>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.write.fmt(f)
    }
}

impl Writer {
    /// A writer and the task that serves it, for the caller to spawn. The
    /// task ends when every `Writer` handle is dropped, after finishing the
    /// writes already queued. `failed` counts the batches that did not
    /// commit; `awake`, if any, is told of every write while it waits.
    pub fn new(
        storage: Arc<dyn Storage>,
        hub: Arc<WatchHub>,
        failed: Counter,
        awake: Option<Arc<Awake>>,
    ) -> (Writer, impl std::future::Future<Output = ()> + Send + 'static) {
        let (queue, jobs) = mpsc::channel(QUEUE);
        (Writer { queue, awake }, run(jobs, storage, hub, failed))
    }

    /// Runs `mutation` on the row `name` in the next batch; answers after
    /// the batch committed. With `dry_run`, answers its outcome and stores
    /// nothing (it runs in a batch all the same, so it sees the writes
    /// queued before it, as a real write would).
    pub async fn mutate(
        &self,
        name: &str,
        mutation: Mutation,
        dry_run: bool,
    ) -> Result<Committed, StorageError> {
        let _waiting = self.awake.as_ref().map(Awake::wait);
        let (reply, answer) = oneshot::channel();
        let write = PendingWrite { name: name.to_string(), mutation, dry_run };
        let job = Job { write, reply };
        let stopped = || StorageError::NotCommitted("the store is shutting down".into());
        self.queue.send(job).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn run(
    mut jobs: mpsc::Receiver<Job>,
    storage: Arc<dyn Storage>,
    hub: Arc<WatchHub>,
    failed: Counter,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while jobs.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let (writes, replies): (Vec<_>, Vec<_>) =
            batch.drain(..).map(|j| (j.write, j.reply)).unzip();
        match storage.write_batch(writes).await {
            Ok(results) => {
                // Readable before any caller hears of its write. The
                // runtime runs what this thread wakes in order: a few
                // watchers first (a reconciler's watch is a converge's
                // latency, and their fan-out costs less than the answers),
                // many after the answers (every caller would otherwise
                // wait for the whole fan-out of its own write).
                let wake_first = hub.subscribers() <= FEW_WATCHERS;
                let published =
                    hub.append(results.iter().filter_map(|r| r.as_ref().ok()?.event.clone()));
                if wake_first && published > 0 {
                    hub.wake();
                }
                for (reply, result) in replies.into_iter().zip(results) {
                    // The caller may have gone away; the write stands.
                    let _ = reply.send(result);
                }
                if !wake_first && published > 0 {
                    hub.wake();
                }
            }
            Err(e) => {
                failed.inc();
                tracing::warn!(error = %e, writes = replies.len(), "batch did not commit");
                let reason = e.to_string();
                let unknown = matches!(e, StorageError::CommitUnknown(_));
                if unknown {
                    // It may have committed, and its events are published
                    // by no one else (the listener leaves this writer's
                    // commits to it): the tailer reads whatever is new.
                    hub.wake_tailer.notify_one();
                }
                for reply in replies {
                    let error = if unknown {
                        StorageError::CommitUnknown(reason.clone())
                    } else {
                        StorageError::NotCommitted(reason.clone())
                    };
                    let _ = reply.send(Err(error));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use gantry_api::v1::{Gateway, ObjectMeta};

    use super::*;
    use crate::storage::sqlite::SqliteStorage;
    use crate::watch::hub::HubLimits;
    use gantry_core::Write;

    /// The awake thread is told of a write from its queueing to its
    /// answer, whatever holds the commit up (here another connection's
    /// write lock), and of none after.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_is_waiting_for_the_awake_thread_until_it_is_answered() {
        let file = gantry_testkit::temp_dir("writer-awake").join("gantry.db");
        let storage = SqliteStorage::open(&format!("sqlite://{}", file.display())).await.unwrap();
        let Some(awake) = Awake::start(Duration::from_micros(250)).unwrap() else {
            eprintln!("skipped: a CPU quota is set, so no awake thread starts");
            return;
        };
        let limits = HubLimits {
            cache_events: 16,
            cache_bytes: 1 << 20,
            lag_events: 16,
            lag_bytes: 1 << 20,
        };
        let hub = Arc::new(WatchHub::new(storage.current_revision().await.unwrap(), limits));
        let (writer, task) =
            Writer::new(Arc::new(storage), hub, Counter::default(), Some(awake.clone()));
        tokio::spawn(task);
        let other = rusqlite::Connection::open(&file).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let gateway = Gateway {
            metadata: Some(ObjectMeta { name: "a".into(), ..Default::default() }),
            ..Default::default()
        };
        let write = tokio::spawn(async move {
            let put: Mutation = Box::new(move |_| Ok(Write::Put(gateway.clone())));
            writer.mutate("a", put, false).await
        });
        let started = Instant::now();
        while awake.waiting() == 0 {
            assert!(started.elapsed() < Duration::from_secs(30), "the write was never waiting");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(!write.is_finished(), "answered while another connection held the lock");
        assert_eq!(awake.waiting(), 1);
        other.execute_batch("COMMIT").unwrap();
        write.await.unwrap().unwrap();
        assert_eq!(awake.waiting(), 0, "the answered write is still waiting");
    }
}
