//! Keeps a CPU awake while a caller waits for its write, so that the
//! disk's answer and the caller's next request find it running.
//!
//! A write's answer waits for an `fdatasync`, and a client that writes one
//! at a time sends its next request a round trip after the answer. In
//! both waits the store's CPU has nothing to run and halts, and waking a
//! halted CPU is what costs most in a virtual machine: the interrupt goes
//! through the hypervisor, which must schedule the virtual CPU again. On
//! the 2-core virtual machine of docs/benchmarks.md a 1-client write took
//! 0.60–0.65 ms with the CPU halting and 0.39–0.47 ms with it kept awake
//! ("Keeping the CPU awake while a write waits"). Go's scheduler does the
//! same for every Go server, etcd included: its threads spin a while
//! before they sleep.
//!
//! The thread here spins while any write waits for its commit, and for
//! [`Awake::start`]'s `linger` after the last answer. It runs at
//! `SCHED_IDLE` ([`crate::lane::Priority::Idle`]), so any other thread of
//! the process that wakes up takes its CPU at once, and no spin outlasts
//! [`MOST_WITHOUT_PROGRESS`] without a write being asked or answered. It
//! does not spin in a cgroup with a CPU quota (a Kubernetes CPU limit):
//! time spent spinning counts against the quota, and a spent quota stops
//! every thread of the process until the next period.
//!
//! **It is off unless asked for (`--commit-spin`)**, because `SCHED_IDLE`
//! only ranks a thread among those of its own task group. To the kernel,
//! a spinning store is a busy cgroup (or autogroup) like any other, and a
//! process of another one that wakes on the same CPU may wait for the
//! store's time slice to end, up to a scheduler tick: with PostgreSQL
//! sharing the store's CPU, a 1-client write took 4.0 ms instead of
//! about 1 ms. Turn it on where the store has its CPUs to itself, with
//! SQLite or a database on other CPUs.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crate::lane::{lower_priority, Priority};

/// The thread's name.
pub const THREAD: &str = "gantry-awake";

/// The `linger` measured best on one machine: longer than a client's round
/// trip there (about 0.1 ms), short enough that a store written once a
/// second spins well under 0.1 % of the time.
pub const SUGGESTED_LINGER: Duration = Duration::from_micros(250);

/// The longest the thread spins with writes waiting but none asked or
/// answered (a commit held up by a lock, a database gone slow); it then
/// sleeps until the next one.
pub const MOST_WITHOUT_PROGRESS: Duration = Duration::from_millis(10);

/// Where the thread was told of writes; see the module's documentation.
#[derive(Debug)]
pub struct Awake {
    /// Writes waiting for their commit.
    waiting: AtomicUsize,
    /// Writes asked for and answered so far: a change is progress.
    progress: AtomicU64,
    thread: Thread,
    /// The thread's id in /proc (Linux).
    tid: Option<u32>,
}

/// One write waiting, from [`Awake::wait`] until dropped.
#[derive(Debug)]
pub struct Waiting(Arc<Awake>);

impl Awake {
    /// Starts the thread, which spins while writes wait and for `linger`
    /// after; `None` (and no thread) when `linger` is zero or the process
    /// has a CPU quota. The thread ends when the last `Arc` is dropped.
    pub fn start(linger: Duration) -> std::io::Result<Option<Arc<Awake>>> {
        if linger.is_zero() {
            return Ok(None);
        }
        if let Some(file) = cpu_quota() {
            tracing::info!(
                quota = %file.display(),
                "a CPU quota is set: no thread keeps the CPU awake while writes wait"
            );
            return Ok(None);
        }
        let (give, take) = std::sync::mpsc::channel::<Weak<Awake>>();
        let (tell, told) = std::sync::mpsc::channel::<Option<u32>>();
        let handle = std::thread::Builder::new().name(THREAD.into()).spawn(move || {
            lower_priority(THREAD, Priority::Idle { fallback_nice: 19 });
            let _ = tell.send(own_tid());
            if let Ok(awake) = take.recv() {
                run(&awake, linger);
            }
        })?;
        let awake = Arc::new(Awake {
            waiting: AtomicUsize::new(0),
            progress: AtomicU64::new(0),
            thread: handle.thread().clone(),
            tid: told.recv().ok().flatten(),
        });
        tracing::debug!(tid = awake.tid, ?linger, "a thread keeps the CPU awake while writes wait");
        // The thread holds a weak reference: dropping the last `Arc` ends it.
        let _ = give.send(Arc::downgrade(&awake));
        Ok(Some(awake))
    }

    /// Writes waiting now.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Marks one write as waiting until the returned guard is dropped.
    pub fn wait(self: &Arc<Self>) -> Waiting {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        self.progress.fetch_add(1, Ordering::Release);
        // An atomic swap when the thread is not asleep.
        self.thread.unpark();
        Waiting(self.clone())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
        self.0.progress.fetch_add(1, Ordering::Release);
        self.0.thread.unpark();
    }
}

impl Drop for Awake {
    fn drop(&mut self) {
        // Wakes the thread to find the `Weak` dead.
        self.thread.unpark();
    }
}

/// The thread: asleep until a write waits, then spinning until `linger`
/// has passed with none waiting, or [`MOST_WITHOUT_PROGRESS`] with writes
/// waiting but no progress.
fn run(awake: &Weak<Awake>, linger: Duration) {
    loop {
        let Some(shared) = awake.upgrade() else { return };
        if shared.waiting.load(Ordering::Acquire) > 0 {
            spin(&shared, linger);
        }
        drop(shared);
        std::thread::park();
    }
}

fn spin(awake: &Awake, linger: Duration) {
    let mut seen = awake.progress.load(Ordering::Acquire);
    let mut since = Instant::now();
    loop {
        std::hint::spin_loop();
        let now = Instant::now();
        let progress = awake.progress.load(Ordering::Acquire);
        if progress != seen {
            (seen, since) = (progress, now);
        }
        let bound = match awake.waiting.load(Ordering::Acquire) {
            0 => linger,
            _ => MOST_WITHOUT_PROGRESS,
        };
        if now.duration_since(since) >= bound {
            return;
        }
    }
}

/// The calling thread's id, from `/proc/thread-self` (`PID/task/TID`).
fn own_tid() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// The file that sets a CPU quota on this process's cgroup or one above
/// it, if any (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`).
fn cpu_quota() -> Option<PathBuf> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    quota_files(&cgroups, Path::new("/sys/fs/cgroup"))
        .into_iter()
        .find(|file| std::fs::read_to_string(file).is_ok_and(|text| limits_cpu(&text)))
}

/// The quota files of the cgroups `/proc/self/cgroup` names, from the
/// process's own up to the root of each hierarchy mounted under `root`.
fn quota_files(proc_self_cgroup: &str, root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for line in proc_self_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (mounts, file): (Vec<PathBuf>, &str) = if controllers.is_empty() {
            (vec![root.to_path_buf()], "cpu.max")
        } else if controllers.split(',').any(|c| c == "cpu") {
            (vec![root.join(controllers), root.join("cpu")], "cpu.cfs_quota_us")
        } else {
            continue;
        };
        for mount in mounts {
            let mut dir = Some(Path::new(path.trim_start_matches('/')));
            while let Some(at) = dir {
                files.push(mount.join(at).join(file));
                dir = at.parent();
            }
        }
    }
    files
}

/// Whether a quota file's text sets a quota: v2 `cpu.max` is `max PERIOD`
/// without one, `QUOTA PERIOD` with; v1 `cpu.cfs_quota_us` is `-1` without.
fn limits_cpu(text: &str) -> bool {
    match text.split_whitespace().next() {
        Some("max") | None => false,
        Some(quota) => quota.parse::<i64>().is_ok_and(|q| q > 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_files_cover_both_hierarchies_up_to_their_roots() {
        let files = |proc_self_cgroup: &str| -> Vec<String> {
            let files = quota_files(proc_self_cgroup, Path::new("/sys/fs/cgroup"));
            files.iter().map(|p| p.display().to_string()).collect()
        };
        assert_eq!(
            files("0::/kubepods/pod1/c1\n"),
            [
                "/sys/fs/cgroup/kubepods/pod1/c1/cpu.max",
                "/sys/fs/cgroup/kubepods/pod1/cpu.max",
                "/sys/fs/cgroup/kubepods/cpu.max",
                "/sys/fs/cgroup/cpu.max",
            ]
        );
        assert_eq!(
            files("12:memory:/a\n4:cpu,cpuacct:/a/b\n0::/\n"),
            [
                "/sys/fs/cgroup/cpu,cpuacct/a/b/cpu.cfs_quota_us",
                "/sys/fs/cgroup/cpu,cpuacct/a/cpu.cfs_quota_us",
                "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us",
                "/sys/fs/cgroup/cpu/a/b/cpu.cfs_quota_us",
                "/sys/fs/cgroup/cpu/a/cpu.cfs_quota_us",
                "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
                "/sys/fs/cgroup/cpu.max",
            ]
        );
        assert!(files("garbage\n4:cpu\n").is_empty());
    }

    #[test]
    fn only_a_positive_quota_limits_the_cpu() {
        for (text, limited) in [
            ("max 100000\n", false),
            ("50000 100000\n", true),
            ("-1\n", false),
            ("150000\n", true),
            ("", false),
            ("junk", false),
        ] {
            assert_eq!(limits_cpu(text), limited, "{text:?}");
        }
    }

    /// The thread's CPU time (user and system), from /proc in clock ticks
    /// of 10 ms.
    fn cpu_time(awake: &Awake) -> Duration {
        let stat = format!("/proc/self/task/{}/stat", awake.tid.expect("a thread id"));
        let stat = std::fs::read_to_string(stat).unwrap();
        let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        Duration::from_millis(ticks * 10)
    }

    /// A thread lingering `linger`, or `None` (said on stderr) under a CPU
    /// quota, where none starts.
    fn started(linger: Duration) -> Option<Arc<Awake>> {
        if let Some(file) = cpu_quota() {
            eprintln!("skipped: {} sets a CPU quota, so nothing spins", file.display());
            return None;
        }
        Some(Awake::start(linger).unwrap().expect("no quota, a thread"))
    }

    #[test]
    fn spins_while_a_write_waits_and_sleeps_once_the_linger_has_passed() {
        let Some(awake) = started(Duration::from_millis(20)) else { return };
        // Asleep while no write waits: its start costs under two ticks.
        std::thread::sleep(Duration::from_millis(300));
        let idle = cpu_time(&awake);
        assert!(idle <= Duration::from_millis(20), "the thread spun before any write: {idle:?}");
        let waiting = awake.wait();
        // Spins while writes wait and others come and go, on CPU time no
        // one else wants: on a busy machine that comes slowly, hence a
        // bound of a minute.
        let started = Instant::now();
        while cpu_time(&awake) < idle + Duration::from_millis(30) {
            assert!(started.elapsed() < Duration::from_secs(60), "the thread did not spin");
            drop(awake.wait());
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(waiting);
        // Asleep again once the linger has passed: no more CPU time.
        std::thread::sleep(Duration::from_millis(100));
        let settled = cpu_time(&awake);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(cpu_time(&awake), settled, "the thread spun with no write waiting");
    }

    #[test]
    fn a_write_that_makes_no_progress_stops_the_spin() {
        let Some(awake) = started(Duration::from_millis(1)) else { return };
        let _stuck = awake.wait();
        std::thread::sleep(MOST_WITHOUT_PROGRESS * 5);
        let settled = cpu_time(&awake);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(cpu_time(&awake), settled, "the thread spun on without progress");
    }

    #[test]
    fn zero_linger_starts_no_thread_and_the_thread_ends_with_the_last_handle() {
        assert!(Awake::start(Duration::ZERO).unwrap().is_none());
        let Some(awake) = Awake::start(SUGGESTED_LINGER).unwrap() else { return };
        let task = format!("/proc/self/task/{}", awake.tid.expect("a thread id"));
        assert!(Path::new(&task).exists());
        let waiting = awake.wait();
        drop(awake);
        // A waiting write holds the thread's `Awake`.
        std::thread::sleep(Duration::from_millis(50));
        assert!(Path::new(&task).exists(), "the thread ended while a write waited");
        drop(waiting);
        let started = Instant::now();
        while Path::new(&task).exists() {
            assert!(started.elapsed() < Duration::from_secs(30), "the thread did not end");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
