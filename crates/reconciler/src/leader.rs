//! Leader election through a coordination.k8s.io/v1 Lease, as client-go's
//! leaderelection does:
//!
//! - the holder renews every retry period; a holder that has not renewed
//!   for the **renew deadline** (shorter than the lease duration) stops
//!   leading, which cancels the passes in flight, before any candidate can
//!   take over;
//! - a candidate takes over only after seeing the record **unchanged for a
//!   whole lease duration on its own clock** (the time it last observed a
//!   change), never by comparing the holder's `renewTime` with its clock;
//! - writes carry the Lease's resourceVersion, so two candidates never both
//!   win; the holder releases the lease on shutdown so a successor need not
//!   wait.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;

/// Whether this process may write to the cluster now: always without an
/// election; with one, only until the last successful renewal (timed from
/// when it was sent) plus the renew deadline. Checked before every write,
/// so a leader frozen mid-pass (SIGSTOP, a long pause) that wakes after
/// its tenure writes nothing, even before its workers notice.
#[derive(Debug, Clone, Default)]
pub struct Fence(Option<Arc<Mutex<Option<Instant>>>>);

impl Fence {
    /// A fence held by an election: closed until the first renewal.
    pub fn elected() -> Self {
        Fence(Some(Arc::default()))
    }

    pub fn allows(&self) -> bool {
        match &self.0 {
            None => true,
            Some(until) => until
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .is_some_and(|until| Instant::now() < until),
        }
    }

    pub(crate) fn hold_until(&self, until: Option<Instant>) {
        if let Some(m) = &self.0 {
            *m.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = until;
        }
    }
}

/// Lease settings.
#[derive(Debug, Clone)]
pub struct ElectionSettings {
    pub lease_name: String,
    pub namespace: String,
    /// This candidate's identity (unique per process).
    pub identity: String,
    pub lease_duration: Duration,
    /// A leader that could not renew for this long steps down.
    pub renew_deadline: Duration,
    /// How often the holder renews and a candidate retries.
    pub retry_period: Duration,
    /// Opened for the renew deadline after each renewal.
    pub fence: Fence,
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// What a candidate last saw of the Lease, and when (local clock).
#[derive(Debug, Default)]
struct Observed {
    record: Option<LeaseSpec>,
    at: Option<Instant>,
}

impl Observed {
    fn see(&mut self, spec: &LeaseSpec) {
        if self.record.as_ref() != Some(spec) {
            self.record = Some(spec.clone());
            self.at = Some(Instant::now());
        }
    }

    /// Whether the holder's lease ran out: its record has not changed for a
    /// whole lease duration of our clock.
    fn expired(&self, lease_duration: Duration) -> bool {
        self.at.is_none_or(|at| at.elapsed() > lease_duration)
    }
}

/// One round: acquire, renew or observe. `Ok(true)` when we hold the lease.
async fn try_acquire(
    api: &Api<Lease>,
    s: &ElectionSettings,
    observed: &mut Observed,
) -> Result<bool, kube::Error> {
    let duration_seconds = i32::try_from(s.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
    let Some(mut lease) = api.get_opt(&s.lease_name).await? else {
        let spec = LeaseSpec {
            holder_identity: Some(s.identity.clone()),
            lease_duration_seconds: Some(duration_seconds),
            acquire_time: Some(now()),
            renew_time: Some(now()),
            lease_transitions: Some(0),
            ..Default::default()
        };
        let lease = Lease {
            metadata: ObjectMeta { name: Some(s.lease_name.clone()), ..Default::default() },
            spec: Some(spec.clone()),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => {
                observed.see(&spec);
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    observed.see(spec);
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let duration = Duration::from_secs(
        u64::try_from(spec.lease_duration_seconds.unwrap_or(duration_seconds)).unwrap_or(1),
    );
    if holder == s.identity {
        spec.renew_time = Some(now());
    } else if holder.is_empty() || observed.expired(duration) {
        spec.holder_identity = Some(s.identity.clone());
        spec.acquire_time = Some(now());
        spec.renew_time = Some(now());
        spec.lease_duration_seconds = Some(duration_seconds);
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    } else {
        return Ok(false);
    }
    let written = spec.clone();
    match api.replace(&s.lease_name, &PostParams::default(), &lease).await {
        Ok(_) => {
            observed.see(&written);
            Ok(true)
        }
        // Someone else renewed or took over first.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

async fn release(api: &Api<Lease>, s: &ElectionSettings) {
    if let Ok(Some(mut lease)) = api.get_opt(&s.lease_name).await {
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() == Some(s.identity.as_str()) {
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            if api.replace(&s.lease_name, &PostParams::default(), &lease).await.is_ok() {
                tracing::info!(identity = %s.identity, "lease released");
            }
        }
    }
}

/// Campaigns until `shutdown`, publishing whether we lead on `leading`. A
/// leader that cannot renew within the renew deadline steps down before
/// anyone else can take over.
pub async fn run(
    api: Api<Lease>,
    settings: ElectionSettings,
    leading: watch::Sender<bool>,
    shutdown: gantry_runtime::Shutdown,
) {
    let mut observed = Observed::default();
    let mut last_renewal = Instant::now();
    loop {
        // A round may not outlast what is left of the renew deadline.
        let budget = if *leading.borrow() {
            settings.renew_deadline.saturating_sub(last_renewal.elapsed())
        } else {
            settings.retry_period
        }
        .max(Duration::from_millis(10));
        let sent = Instant::now();
        let outcome =
            tokio::time::timeout(budget, try_acquire(&api, &settings, &mut observed)).await;
        let leader = match outcome {
            Ok(Ok(true)) => {
                last_renewal = sent;
                settings.fence.hold_until(Some(sent + settings.renew_deadline));
                true
            }
            Ok(Ok(false)) => false,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "leader election round failed");
                *leading.borrow() && last_renewal.elapsed() < settings.renew_deadline
            }
            Err(_) => *leading.borrow() && last_renewal.elapsed() < settings.renew_deadline,
        };
        if !leader {
            settings.fence.hold_until(None);
        }
        if leader != *leading.borrow() {
            tracing::info!(identity = %settings.identity, leader, "leadership changed");
            let _ = leading.send(leader);
        }
        let wait = if leader {
            // Wake in time to step down at the deadline if renewals fail.
            settings
                .retry_period
                .min(settings.renew_deadline.saturating_sub(last_renewal.elapsed()))
        } else {
            settings.retry_period
        };
        tokio::select! {
            () = shutdown.wait() => break,
            () = tokio::time::sleep(wait) => {}
        }
    }
    settings.fence.hold_until(None);
    if *leading.borrow() {
        let _ = leading.send(false);
        release(&api, &settings).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_fence_is_open_only_within_the_tenure() {
        assert!(Fence::default().allows(), "no election: always open");
        let fence = Fence::elected();
        assert!(!fence.allows(), "closed until the first renewal");
        fence.hold_until(Some(Instant::now() + Duration::from_secs(10)));
        assert!(fence.allows());
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!fence.allows(), "open past the renew deadline");
        fence.hold_until(Some(Instant::now() + Duration::from_secs(10)));
        fence.hold_until(None);
        assert!(!fence.allows(), "closed on stepping down");
    }
}
