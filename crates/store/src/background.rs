//! Work run at a lower CPU priority: the viewers' lists. Seats bound how
//! many lists run at once, not whose CPU goes first; on a small machine a
//! level that always has a page of objects in flight would share the CPU
//! evenly with the editors' and the reconciler's calls. Here that work
//! runs on a thread of its own with a raised nice value
//! ([`BACKGROUND_NICE`]), so the kernel serves the other threads first and
//! gives this one what they leave.
//!
//! Its reads go through their own database connections
//! ([`crate::storage::Storage::for_background`]): SQLite runs each
//! connection on a thread that the thread first using it makes, and a
//! thread takes its maker's priority.

use std::future::Future;
use std::sync::Arc;

use crate::lane::Lane;
use crate::storage::Storage;

/// The nice value of the background thread (0 is the default; 19 the
/// lowest priority).
pub const BACKGROUND_NICE: i32 = 10;

/// The background thread's name.
pub const THREAD: &str = "gantry-background";

/// A [`Lane`] at [`BACKGROUND_NICE`], stopped when dropped.
#[derive(Debug)]
pub struct Background {
    lane: Lane,
    storage: Arc<dyn Storage>,
}

impl Background {
    /// Starts the thread; its work reads through `storage`'s background
    /// connections.
    pub fn start(storage: &Arc<dyn Storage>) -> std::io::Result<Background> {
        let lane = Lane::start(THREAD, Some(BACKGROUND_NICE))?;
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

    /// A thread's name and nice value from its `stat` file.
    fn name_and_nice(stat: &str) -> (String, i64) {
        let (head, after) = stat.rsplit_once(')').unwrap();
        let name = head.split_once('(').unwrap().1.to_string();
        // After the name: state is the 3rd field of the line, nice the 19th.
        (name, after.split_whitespace().nth(16).unwrap().parse().unwrap())
    }

    fn nice_of_current_thread() -> i64 {
        name_and_nice(&std::fs::read_to_string("/proc/thread-self/stat").unwrap()).1
    }

    /// The nice values of this process's threads named `prefix...`.
    fn nices_of(prefix: &str) -> Vec<i64> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("stat")).ok())
            .map(|stat| name_and_nice(&stat))
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(_, nice)| nice)
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
        assert!(!nices_of(sqlite_threads).contains(&i64::from(BACKGROUND_NICE)));
        let (nice, name, read) = background
            .run(|storage| async move {
                let page =
                    crate::storage::Page { after: "", limit: 10, max_bytes: 1 << 20, at: None };
                let read = storage.list(page).await.map(|s| s.gateways.len());
                let name = std::thread::current().name().map(str::to_string);
                (nice_of_current_thread(), name, read)
            })
            .await
            .unwrap();
        assert_eq!(nice, i64::from(BACKGROUND_NICE));
        assert_eq!(name.as_deref(), Some(THREAD));
        assert_eq!(read.unwrap(), 0);
        assert_eq!(nice_of_current_thread(), 0, "the caller's priority changed");
        // The read went through a SQLite thread of the background's
        // priority; the others keep theirs.
        let nices = nices_of(sqlite_threads);
        assert!(nices.contains(&i64::from(BACKGROUND_NICE)), "{nices:?}");
        assert!(nices.contains(&0), "{nices:?}");
        drop(background);
        let _ = std::fs::remove_dir_all(dir);
    }
}
