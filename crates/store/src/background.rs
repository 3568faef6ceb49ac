//! Work run at a lower CPU priority: the viewers' lists. Seats bound how
//! many lists run at once, not whose CPU goes first; on a small machine a
//! level that always has a page of objects in flight would share the CPU
//! evenly with the editors' and the reconciler's calls. Here that work
//! runs on a thread of its own scheduled `SCHED_IDLE`
//! ([`crate::lane::Priority::Idle`]), so the kernel serves the other
//! threads first, takes the CPU from this one as soon as one of them wakes
//! up, and gives it what they leave. Under a load that keeps every core
//! busy with other work, the viewers' lists wait; their seats' queue wait
//! and their callers' deadlines bound how long.
//!
//! Its reads go through their own database connections
//! ([`crate::storage::Storage::for_background`]): SQLite runs each
//! connection on a thread that the thread first using it makes, and a
//! thread takes its maker's priority.

use std::future::Future;
use std::sync::Arc;

use crate::lane::{Lane, Priority};
use crate::storage::Storage;

/// The nice value of the background thread, which is what orders it where
/// the kernel refuses `SCHED_IDLE` (0 is the default; 19 the lowest
/// priority).
pub const BACKGROUND_NICE: i32 = 10;

/// The background thread's scheduling.
pub const PRIORITY: Priority = Priority::Idle { fallback_nice: BACKGROUND_NICE };

/// The background thread's name.
pub const THREAD: &str = "gantry-background";

/// A [`Lane`] at [`PRIORITY`], stopped when dropped.
#[derive(Debug)]
pub struct Background {
    lane: Lane,
    storage: Arc<dyn Storage>,
}

impl Background {
    /// Starts the thread; its work reads through `storage`'s background
    /// connections.
    pub fn start(storage: &Arc<dyn Storage>) -> std::io::Result<Background> {
        let lane = Lane::start(THREAD, PRIORITY)?;
        Ok(Background { lane, storage: storage.for_background() })
    }

    /// Runs `work` on the background thread with its storage; its output,
    /// or `None` when the thread is gone (the store is stopping).
    pub async fn run<F, Fut, T>(&self, work: F) -> Option<T>
    where
        F: FnOnce(Arc<dyn Storage>) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        self.lane.spawn(work(self.storage.clone())).await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `SCHED_OTHER` and `SCHED_IDLE` (sched(7)).
    const OTHER: i64 = 0;
    const IDLE: i64 = 5;

    /// A thread's name, nice value and scheduling policy from its `stat`
    /// file.
    fn scheduling(stat: &str) -> (String, (i64, i64)) {
        let (head, after) = stat.rsplit_once(')').unwrap();
        let name = head.split_once('(').unwrap().1.to_string();
        // After the name: state is the 3rd field of the line, nice the
        // 19th, policy the 41st (proc_pid_stat(5)).
        let field = |n: usize| after.split_whitespace().nth(n - 3).unwrap().parse().unwrap();
        (name, (field(19), field(41)))
    }

    fn scheduling_of_current_thread() -> (i64, i64) {
        scheduling(&std::fs::read_to_string("/proc/thread-self/stat").unwrap()).1
    }

    /// The (nice value, policy) of this process's threads named
    /// `prefix...`.
    fn scheduling_of(prefix: &str) -> Vec<(i64, i64)> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("stat")).ok())
            .map(|stat| scheduling(&stat))
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(_, scheduling)| scheduling)
            .collect()
    }

    #[tokio::test]
    async fn work_runs_on_a_thread_of_lower_priority_and_the_caller_keeps_its_own() {
        let dir = std::env::temp_dir().join(format!("gantry-bg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}", dir.join("gantry.db").display());
        let storage: Arc<dyn Storage> =
            Arc::new(crate::storage::sqlite::SqliteStorage::open(&url).await.unwrap());
        let background = Background::start(&storage).unwrap();
        let sqlite_threads = "sqlx-sqlite-wor";
        let lowered = (i64::from(BACKGROUND_NICE), IDLE);
        assert!(!scheduling_of(sqlite_threads).contains(&lowered));
        let (scheduling, name, read) = background
            .run(|storage| async move {
                let page =
                    crate::storage::Page { after: "", limit: 10, max_bytes: 1 << 20, at: None };
                let read = storage.list(page).await.map(|s| s.gateways.len());
                let name = std::thread::current().name().map(str::to_string);
                (scheduling_of_current_thread(), name, read)
            })
            .await
            .unwrap();
        assert_eq!(scheduling, lowered);
        assert_eq!(name.as_deref(), Some(THREAD));
        assert_eq!(read.unwrap(), 0);
        assert_eq!(scheduling_of_current_thread(), (0, OTHER), "the caller's priority changed");
        // The read went through a SQLite thread of the background's
        // scheduling; the others keep theirs.
        let threads = scheduling_of(sqlite_threads);
        assert!(threads.contains(&lowered), "{threads:?}");
        assert!(threads.contains(&(0, OTHER)), "{threads:?}");
        drop(background);
        let _ = std::fs::remove_dir_all(dir);
    }
}
