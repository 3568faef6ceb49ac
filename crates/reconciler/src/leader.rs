//! Leader election through a coordination.k8s.io/v1 Lease, as client-go's
//! leaderelection does: the holder renews `renewTime` every retry period;
//! another candidate takes over once `renewTime + leaseDurationSeconds` has
//! passed; the holder releases the lease on shutdown so a successor need
//! not wait. Writes use the Lease's resourceVersion, so two candidates
//! never both win.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;

/// Lease settings.
#[derive(Debug, Clone)]
pub struct ElectionSettings {
    pub lease_name: String,
    pub namespace: String,
    /// This candidate's identity (unique per process).
    pub identity: String,
    pub lease_duration: Duration,
    /// How often the holder renews and a candidate retries.
    pub retry_period: Duration,
}

fn millis(t: &Option<MicroTime>) -> i64 {
    t.as_ref().map_or(0, |t| t.0.as_millisecond())
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// One round: acquire, renew or observe. `Ok(true)` when we hold the lease.
async fn try_acquire(api: &Api<Lease>, s: &ElectionSettings) -> Result<bool, kube::Error> {
    let duration_seconds = i32::try_from(s.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
    let Some(mut lease) = api.get_opt(&s.lease_name).await? else {
        let lease = Lease {
            metadata: ObjectMeta { name: Some(s.lease_name.clone()), ..Default::default() },
            spec: Some(LeaseSpec {
                holder_identity: Some(s.identity.clone()),
                lease_duration_seconds: Some(duration_seconds),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let duration_ms = i64::from(spec.lease_duration_seconds.unwrap_or(duration_seconds)) * 1000;
    let expired = millis(&spec.renew_time) + duration_ms < Timestamp::now().as_millisecond();
    if holder == s.identity {
        spec.renew_time = Some(now());
    } else if holder.is_empty() || expired {
        spec.holder_identity = Some(s.identity.clone());
        spec.acquire_time = Some(now());
        spec.renew_time = Some(now());
        spec.lease_duration_seconds = Some(duration_seconds);
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    } else {
        return Ok(false);
    }
    match api.replace(&s.lease_name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
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

/// Campaigns until `stop`, publishing whether we lead on `leading`. A
/// leader that cannot renew within the lease duration steps down before
/// anyone else can take over.
pub async fn run(
    api: Api<Lease>,
    settings: ElectionSettings,
    leading: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut last_renewal = tokio::time::Instant::now();
    loop {
        let outcome = tokio::time::timeout(
            settings.retry_period.max(Duration::from_millis(100)) * 2,
            try_acquire(&api, &settings),
        )
        .await;
        let leader = match outcome {
            Ok(Ok(held)) => {
                if held {
                    last_renewal = tokio::time::Instant::now();
                }
                held
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "leader election round failed");
                *leading.borrow() && last_renewal.elapsed() < settings.lease_duration
            }
            Err(_) => *leading.borrow() && last_renewal.elapsed() < settings.lease_duration,
        };
        if leader != *leading.borrow() {
            tracing::info!(identity = %settings.identity, leader, "leadership changed");
            let _ = leading.send(leader);
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            () = tokio::time::sleep(settings.retry_period) => {}
        }
    }
    if *leading.borrow() {
        let _ = leading.send(false);
        release(&api, &settings).await;
    }
}
