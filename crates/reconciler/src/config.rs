//! Command-line flags of gateway-reconciler; every flag also reads an
//! environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, ValueEnum};
use gantry_core::duration::parse_duration;

/// Where manifests go.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetKind {
    /// A Kubernetes cluster, by server-side apply.
    Kube,
    /// YAML files under --directory (no cluster needed).
    Directory,
}

/// Converges every Gateway in gateway-store onto Kubernetes or a directory.
#[derive(Parser, Clone, Debug)]
#[command(
    name = "gateway-reconciler",
    version,
    about = "Converges every Gateway in gateway-store onto Kubernetes (or a directory) and reports status back",
    after_help = "Examples:\n  \
        gateway-reconciler --store http://127.0.0.1:50051 --target directory --directory ./manifests\n  \
        gateway-reconciler --store https://gateway-store:50051 --store-ca ca.pem --token-file /var/run/gantry/token --target kube --namespace gateways"
)]
pub struct Config {
    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, env = "GANTRY_RECONCILER_HTTP_LISTEN", default_value = "127.0.0.1:9091")]
    pub http_listen: SocketAddr,

    #[command(flatten)]
    pub gateway_store: StoreArgs,

    #[command(flatten)]
    pub manifests: TargetArgs,

    #[command(flatten)]
    pub render: RenderArgs,

    #[command(flatten)]
    pub control: LoopArgs,

    #[command(flatten)]
    pub leader: LeaderArgs,

    #[command(flatten)]
    pub log: gantry_runtime::LogArgs,

    #[command(flatten)]
    pub admin: gantry_runtime::admin::AdminArgs,
}

/// How to reach gateway-store.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Store")]
pub struct StoreArgs {
    /// gRPC URL of gateway-store.
    #[arg(long, env = "GANTRY_STORE", default_value = "http://127.0.0.1:50051")]
    pub store: String,

    /// File holding the bearer token (role reconciler) for the store.
    #[arg(long, env = "GANTRY_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,

    /// PEM CA certificate to trust for an https:// store.
    #[arg(long, env = "GANTRY_STORE_CA")]
    pub store_ca: Option<PathBuf>,
}

/// Where manifests go.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Target")]
pub struct TargetArgs {
    /// Where manifests go.
    #[arg(long, env = "GANTRY_TARGET", value_enum, default_value_t = TargetKind::Directory)]
    pub target: TargetKind,

    /// Kubeconfig for --target kube and --leader-elect: only this file, as
    /// kubectl's --kubeconfig. Without it: $KUBECONFIG (several paths,
    /// merged by kubectl's rules) or ~/.kube/config, and when there is
    /// none, the pod's service account (in-cluster).
    #[arg(long, env = "GANTRY_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Namespace the gateways' objects live in. Give gateways a namespace of
    /// their own, never the control plane's: an object of another owner in
    /// it stops the gateway that would overwrite it.
    #[arg(long, env = "GANTRY_NAMESPACE", default_value = "default")]
    pub namespace: String,

    /// Directory for --target directory.
    #[arg(long, env = "GANTRY_DIRECTORY", default_value = "gantry-manifests")]
    pub directory: PathBuf,

    /// When the cluster refuses a change to a field that cannot change on a
    /// live object (a Deployment's selector), replace the object for every
    /// gateway instead of reporting it (per gateway: the annotation
    /// `gantry.dev/recreate-on-immutable: "true"`). A replaced Deployment's
    /// pods serve until the new ones are available.
    #[arg(long, env = "GANTRY_RECREATE_ON_IMMUTABLE")]
    pub recreate_on_immutable: bool,
}

/// What the rendered objects carry.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Rendering")]
pub struct RenderArgs {
    /// Prefix of the names of every object derived from a gateway
    /// (`<prefix><gateway>`), for clusters with naming rules.
    #[arg(long, env = "GANTRY_NAME_PREFIX", default_value = "")]
    pub name_prefix: String,

    /// `ingressClassName` of gateways' Ingresses ("" for the cluster's
    /// default class). Their annotations tell ingress-nginx (and the
    /// Service tells Traefik) that the backend speaks HTTPS.
    #[arg(long, env = "GANTRY_INGRESS_CLASS", default_value = "nginx")]
    pub ingress_class: String,

    /// Requests and limits of the gateway container where a gateway's
    /// `spec.resources` says nothing (requests.NAME=Q,limits.NAME=Q,...).
    #[arg(long, env = "GANTRY_GATEWAY_RESOURCES", default_value = crate::render::DEFAULT_GATEWAY_RESOURCES, value_parser = crate::render::Resources::parse)]
    pub gateway_resources: crate::render::Resources,

    /// Requests and limits of the supervisor sidecar
    /// (requests.NAME=Q,limits.NAME=Q,...).
    #[arg(long, env = "GANTRY_SUPERVISOR_RESOURCES", default_value = crate::render::DEFAULT_SUPERVISOR_RESOURCES, value_parser = crate::render::Resources::parse)]
    pub supervisor_resources: crate::render::Resources,

    /// Supervisor image for gateways that do not name one.
    #[arg(
        long,
        env = "GANTRY_SUPERVISOR_IMAGE",
        default_value = "ghcr.io/gantry-dev/supervisor:0.1.0"
    )]
    pub supervisor_image: String,

    /// How long a rollout may make no progress before its Deployment reports
    /// ProgressDeadlineExceeded and the gateway turns DEGRADED (whole
    /// seconds, at least 1s).
    #[arg(long, env = "GANTRY_PROGRESS_DEADLINE", default_value = "10m", value_parser = parse_progress_deadline)]
    pub progress_deadline: Duration,

    /// How long a route may wait for a load-balancer address on its Ingress
    /// before the gateway is DEGRADED.
    #[arg(long, env = "GANTRY_ROUTE_DEADLINE", default_value = "10m", value_parser = parse_duration)]
    pub route_deadline: Duration,
}

/// How often and how hard the control loop works.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Control loop")]
pub struct LoopArgs {
    /// Gateways reconciled at once.
    #[arg(long, env = "GANTRY_CONCURRENCY", default_value_t = 16)]
    pub concurrency: usize,

    /// Every gateway is re-checked about this often (jittered).
    #[arg(long, env = "GANTRY_SYNC_PERIOD", default_value = "5m", value_parser = parse_duration)]
    pub sync_period: Duration,

    /// Re-check interval while a rollout is in progress or stalled.
    #[arg(long, env = "GANTRY_POLL_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    pub poll_interval: Duration,

    /// Apply attempts per generation before a gateway is FAILED.
    #[arg(long, env = "GANTRY_RETRY_BUDGET", default_value_t = 5)]
    pub retry_budget: u32,

    /// Shortest wait before a FAILED gateway is tried again (the wait is
    /// the larger of this and --sync-period).
    #[arg(long, env = "GANTRY_FAILED_RETRY_FLOOR", default_value = "1m", value_parser = parse_duration)]
    pub failed_retry_floor: Duration,

    /// First backoff after a failed apply (it doubles per attempt).
    #[arg(long, env = "GANTRY_RETRY_BACKOFF", default_value = "1s", value_parser = parse_duration)]
    pub retry_backoff: Duration,

    /// Longest one call to the cluster may take; a call that takes longer
    /// fails the apply (and counts against its budget).
    #[arg(long, env = "GANTRY_CALL_TIMEOUT", default_value = "15s", value_parser = parse_duration)]
    pub call_timeout: Duration,

    /// Longest the apply (or the cleanup) of one gateway may take as a
    /// whole, however healthy each call: a backstop above --call-timeout
    /// times the calls of one apply (about a dozen).
    #[arg(long, env = "GANTRY_APPLY_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    pub apply_timeout: Duration,

    /// Roll back a rollout that exceeds its progress deadline to the pods
    /// that served before it, for every gateway (per gateway: the
    /// annotation `gantry.dev/rollback-on-failure: "true"`); the gateway is
    /// then DEGRADED with reason RolledBack until its spec changes.
    #[arg(long, env = "GANTRY_ROLLBACK_ON_FAILURE")]
    pub rollback_on_failure: bool,
}

/// Leader election among replicas.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Leader election")]
pub struct LeaderArgs {
    /// Elect one leader among replicas through a coordination.k8s.io Lease
    /// (needs a cluster: in-cluster config or --kubeconfig); only the leader
    /// reconciles.
    #[arg(long, env = "GANTRY_LEADER_ELECT")]
    pub leader_elect: bool,

    /// Name of the Lease used for leader election.
    #[arg(long, env = "GANTRY_LEASE_NAME", default_value = "gateway-reconciler")]
    pub lease_name: String,

    /// Namespace of the Lease (default: --namespace).
    #[arg(long, env = "GANTRY_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,

    /// How long a leader's lease lasts without renewal; candidates take
    /// over only after seeing it unchanged this long.
    #[arg(long, env = "GANTRY_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,

    /// A leader that could not renew for this long stops and cancels its
    /// passes (default: two thirds of --lease-duration); shorter than
    /// --lease-duration, so it has stopped before anyone can take over.
    #[arg(long, env = "GANTRY_RENEW_DEADLINE", value_parser = parse_duration)]
    pub renew_deadline: Option<Duration>,

    /// This replica's identity in the Lease (default: host name and pid).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
}

impl Config {
    /// Every flag at its environment variable or its default, as the
    /// binary starts with no flags (for gantry-local, which then sets the
    /// fields it decides).
    pub fn from_env() -> Result<Self, clap::Error> {
        Self::try_parse_from(["gateway-reconciler"])
    }

    /// Refuses durations that would make a loop spin or an election unsafe,
    /// naming the flag.
    pub fn validate(&self) -> Result<(), String> {
        let at_least = |flag: &str, value: Duration, min: Duration| {
            if value < min {
                Err(format!("{flag} {value:?} is too short: at least {min:?}"))
            } else {
                Ok(())
            }
        };
        at_least("--sync-period", self.control.sync_period, Duration::from_secs(1))?;
        at_least("--poll-interval", self.control.poll_interval, Duration::from_millis(50))?;
        at_least("--failed-retry-floor", self.control.failed_retry_floor, Duration::from_secs(1))?;
        at_least("--call-timeout", self.control.call_timeout, Duration::from_millis(100))?;
        at_least("--apply-timeout", self.control.apply_timeout, self.control.call_timeout)?;
        at_least("--retry-backoff", self.control.retry_backoff, Duration::from_millis(10))?;
        at_least("--route-deadline", self.render.route_deadline, Duration::from_secs(1))?;
        at_least("--lease-duration", self.leader.lease_duration, Duration::from_secs(2))?;
        if self.control.concurrency == 0 {
            return Err("--concurrency must be at least 1".into());
        }
        let renew = self.renew_deadline();
        if renew >= self.leader.lease_duration || renew < self.retry_period() * 2 {
            return Err(format!(
                "--renew-deadline {renew:?} must be shorter than --lease-duration {:?} and at least twice the retry period {:?}",
                self.leader.lease_duration,
                self.retry_period()
            ));
        }
        Ok(())
    }

    /// The renew deadline of the leader election.
    pub fn renew_deadline(&self) -> Duration {
        self.leader.renew_deadline.unwrap_or(self.leader.lease_duration * 2 / 3)
    }

    /// How often the leader renews and candidates retry.
    pub fn retry_period(&self) -> Duration {
        (self.leader.lease_duration / 8).max(Duration::from_millis(100))
    }
}

/// A progress deadline: whole seconds, at least one (the API server refuses
/// zero, and fractions cannot be expressed).
fn parse_progress_deadline(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d.as_secs() == 0 || d.subsec_nanos() != 0 || i32::try_from(d.as_secs()).is_err() {
        return Err(format!("{text:?}: give whole seconds, at least 1s"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> Config {
        let mut all = vec!["gateway-reconciler"];
        all.extend_from_slice(args);
        Config::try_parse_from(all).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn durations_that_would_spin_are_refused_naming_the_flag() {
        assert_eq!(config(&[]).validate(), Ok(()));
        for (flag, value) in [
            ("--sync-period", "0s"),
            ("--poll-interval", "0s"),
            ("--failed-retry-floor", "0s"),
            ("--retry-backoff", "0s"),
            ("--lease-duration", "1s"),
            ("--renew-deadline", "15s"),
        ] {
            let error = config(&[flag, value]).validate().unwrap_err();
            assert!(error.contains(flag), "{flag} {value}: {error}");
        }
        let c = config(&["--lease-duration", "15s"]);
        assert!(
            c.renew_deadline() < c.leader.lease_duration
                && c.retry_period() * 2 <= c.renew_deadline()
        );
    }
}
