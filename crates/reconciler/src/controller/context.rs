//! What a pass is handed (as kube-rs' controller-rs `Context`): the store
//! to write through, the target, the settings, the clock, and the shared
//! [`State`] it reads gateways and failure records from. Its methods are
//! the pass's IO, each bounded by a timeout; the decisions are in
//! `reconcile`.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gantry_api::v1::{Gateway, GatewayStatus, ObjectMeta};
use gantry_core::recovery::{Attempts, Inputs};
use tokio::time::Instant;

use super::action::ReconcileError;
use super::clock::timestamp_ms;
use super::plan::DriftRecord;
use super::state::{name_of, rv_of, State};
use super::{Settings, STORE_TIMEOUT};
use crate::render::Rendered;
use crate::status::{Observation, STATUS_PATHS};
use crate::store::{GatewayStore, StoreError};
use crate::targets::{Owner, Target, TargetError};

/// What every pass works with.
#[derive(Debug)]
pub struct Context {
    pub(super) store: Arc<dyn GatewayStore>,
    pub(super) target: Arc<dyn Target>,
    pub(super) settings: Settings,
    pub(super) state: Arc<State>,
    /// Wall clock at `started` (the policy's times are Unix milliseconds;
    /// reading them through tokio's clock lets tests pause time).
    wall_start_ms: u64,
    started: Instant,
}

impl Context {
    pub(super) fn new(
        store: Arc<dyn GatewayStore>,
        target: Arc<dyn Target>,
        settings: Settings,
        state: Arc<State>,
    ) -> Self {
        let wall_start_ms = u64::try_from(
            SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis(),
        )
        .unwrap_or(u64::MAX);
        Self { store, target, settings, state, wall_start_ms, started: Instant::now() }
    }

    /// Unix milliseconds now, on tokio's clock.
    pub(super) fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.wall_start_ms.saturating_add(elapsed)
    }

    /// The failure record for these inputs: this process's, else the one
    /// the status carries (resumed: an overdue retry is spread over its
    /// wait, so a fleet read back after a restart does not retry at once).
    pub(super) fn record(
        &self,
        name: &str,
        current: &GatewayStatus,
        inputs: &Inputs,
    ) -> Option<Attempts> {
        let held = self.state.with_entry(name, |e| match &e.record {
            Some(r) if r.inputs == *inputs => Some(r.clone()),
            _ => {
                e.record = None;
                None
            }
        });
        if let Some(Some(record)) = held {
            return Some(record);
        }
        let recorded = Attempts::recorded(
            inputs,
            current.failure_count,
            &current.failed_inputs,
            timestamp_ms(current.next_retry_time.as_ref()),
            &current.message,
        )?;
        let resumed = self.settings.policy.resume(recorded, self.now_ms(), fastrand::f64());
        self.keep_record(name, Some(resumed.clone()));
        Some(resumed)
    }

    /// The repairs of a drift that came back, held for `name`.
    pub(super) fn drift_record(&self, name: &str) -> Option<DriftRecord> {
        self.state.with_entry(name, |e| e.drift.clone()).flatten()
    }

    /// Counts a repair of `drift` at `inputs`: one more of the same drift,
    /// else the first of another.
    pub(super) fn note_repair(&self, name: &str, inputs: &Inputs, drift: String) {
        self.state.with_entry(name, |e| match &mut e.drift {
            Some(r) if r.inputs == *inputs && r.drift == drift => {
                r.repairs = r.repairs.saturating_add(1);
            }
            held => *held = Some(DriftRecord { inputs: inputs.clone(), drift, repairs: 1 }),
        });
    }

    /// Nothing drifted: the count starts over.
    pub(super) fn forget_drift(&self, name: &str) {
        self.state.with_entry(name, |e| e.drift = None);
    }

    /// Holds `record` for `name` (`None`: none).
    pub(super) fn keep_record(&self, name: &str, record: Option<Attempts>) {
        self.state.with_entry(name, |e| e.record = record);
    }

    /// Notes when `generation` of `name` was first seen.
    pub(super) fn seen(&self, name: &str, generation: i64) {
        self.state.with_entry(name, |e| {
            if !e.first_seen.iter().any(|(g, _)| *g == generation) {
                e.first_seen.push((generation, Instant::now()));
            }
        });
    }

    /// What the target reports of the gateway's objects.
    pub(super) async fn observe(
        &self,
        owner: &Owner,
        rendered: &Rendered,
    ) -> Result<Observation, ReconcileError> {
        let started = std::time::Instant::now();
        let observed =
            tokio::time::timeout(STORE_TIMEOUT, self.target.observe(owner, rendered)).await;
        self.state.metrics.stage("observe", started);
        match observed {
            Ok(Ok(o)) => Ok(o),
            Ok(Err(e)) => Err(ReconcileError::Observe(e)),
            Err(_) => Err(ReconcileError::Observe(TargetError::Timeout {
                what: String::new(),
                after: STORE_TIMEOUT,
            })),
        }
    }

    /// Applies the rendered objects.
    pub(super) async fn apply(
        &self,
        owner: &Owner,
        rendered: &Rendered,
    ) -> Result<(), TargetError> {
        let started = std::time::Instant::now();
        let timeout = self.settings.apply_timeout;
        let applied = tokio::time::timeout(timeout, self.target.apply(owner, rendered)).await;
        self.state.metrics.stage("apply", started);
        match applied {
            Ok(r) => r,
            Err(_) => Err(TargetError::Timeout { what: "apply".into(), after: timeout }),
        }
    }

    /// Deletes what the gateway owns; `true` once it is all gone.
    pub(super) async fn delete(&self, owner: &Owner) -> Result<bool, ReconcileError> {
        let timeout = self.settings.apply_timeout;
        match tokio::time::timeout(timeout, self.target.delete(owner)).await {
            Ok(Ok(gone)) => Ok(gone),
            Ok(Err(e)) if !self.target.may_write() => Err(ReconcileError::NotLeader(e)),
            Ok(Err(e)) => Err(ReconcileError::Cleanup(e)),
            Err(_) => Err(ReconcileError::Cleanup(TargetError::Timeout {
                what: String::new(),
                after: timeout,
            })),
        }
    }

    /// Writes `metadata.finalizers`, conditional on the version read.
    pub(super) async fn set_finalizers(
        &self,
        meta: &ObjectMeta,
        finalizers: Vec<String>,
    ) -> Result<Gateway, ReconcileError> {
        let update = Gateway {
            metadata: Some(ObjectMeta {
                name: meta.name.clone(),
                resource_version: meta.resource_version,
                finalizers,
                ..Default::default()
            }),
            ..Default::default()
        };
        self.update(update, &["metadata.finalizers"]).await
    }

    /// Writes `desired` as the gateway's status, conditional on the version
    /// read; a newly observed generation records its convergence time.
    pub(super) async fn write_status(
        &self,
        gateway: &Gateway,
        desired: GatewayStatus,
    ) -> Result<Gateway, ReconcileError> {
        let name = name_of(gateway);
        let previous = gateway.status.as_ref().map_or(0, |s| s.observed_generation);
        let observed = desired.observed_generation;
        let update = Gateway {
            metadata: Some(ObjectMeta {
                name: name.clone(),
                resource_version: rv_of(gateway),
                ..Default::default()
            }),
            spec: None,
            status: Some(desired),
        };
        let started = std::time::Instant::now();
        let written = self.update(update, &STATUS_PATHS).await;
        self.state.metrics.stage("status_write", started);
        let written = written?;
        if observed > previous {
            let metrics = &self.state.metrics;
            self.state.with_entry(&name, |e| {
                if let Some((_, at)) = e.first_seen.iter().find(|(g, _)| *g == observed) {
                    metrics.convergence.observe(at.elapsed().as_secs_f64());
                }
                e.first_seen.retain(|(g, _)| *g > observed);
            });
        }
        Ok(written)
    }

    /// One UpdateGateway with a mask and the resource_version read. ABORTED
    /// re-reads the gateway and caches what the store says whatever its
    /// version (after a restore from a backup it is lower than the one
    /// read), so the next pass, run at once, works on the fresh copy; a
    /// re-read that fails or brings nothing new backs off instead, so a
    /// conflict never loops hot. NOT_FOUND forgets the gateway.
    async fn update(&self, gateway: Gateway, paths: &[&str]) -> Result<Gateway, ReconcileError> {
        let name = name_of(&gateway);
        let read = rv_of(&gateway);
        match tokio::time::timeout(STORE_TIMEOUT, self.store.update(gateway, paths)).await {
            Ok(Ok(updated)) => {
                self.state.remember(updated.clone());
                Ok(updated)
            }
            Ok(Err(StoreError::Conflict(_))) => {
                tracing::debug!("gateway changed meanwhile; re-reading");
                match tokio::time::timeout(STORE_TIMEOUT, self.store.get(&name)).await {
                    Ok(Ok(fresh)) if rv_of(&fresh) != read => {
                        self.state.replace(fresh);
                        Err(ReconcileError::Conflict)
                    }
                    Ok(Ok(_)) => Err(ReconcileError::Store(format!(
                        "the store refused version {read} of {name} as stale but still serves it"
                    ))),
                    Ok(Err(StoreError::NotFound(_))) => {
                        self.state.forget(&name);
                        Err(ReconcileError::Conflict)
                    }
                    Ok(Err(e)) => Err(ReconcileError::Store(format!("re-reading {name}: {e}"))),
                    Err(_) => Err(ReconcileError::Store(format!(
                        "re-reading {name}: no answer within {STORE_TIMEOUT:?}"
                    ))),
                }
            }
            Ok(Err(StoreError::NotFound(_))) => {
                self.state.forget(&name);
                Err(ReconcileError::Store(format!("gateway {name} is gone")))
            }
            Ok(Err(e)) => Err(ReconcileError::Store(e.to_string())),
            Err(_) => Err(ReconcileError::Store(format!("no answer within {STORE_TIMEOUT:?}"))),
        }
    }

    /// The poll interval: how soon a gateway whose rollout is moving is
    /// looked at again.
    pub(super) fn poll_interval(&self) -> Duration {
        self.settings.poll_interval
    }
}
