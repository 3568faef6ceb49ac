//! Gateways in memory under gantry-core's rules, with faults on demand:
//! the store of the controller's tests.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use gantry_api::v1::{Gateway, ObjectMeta};
use gantry_client::watch::WatchUpdate;
use gantry_core::lifecycle::{self, Write};
use gantry_core::{Role, RuleError};
use prost_types::Timestamp;
use tonic::Status;

use super::{GatewayStore, StoreError};

/// Gateways in memory under gantry-core's rules, with faults on demand.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Memory>>,
    events: Arc<Mutex<Vec<Subscriber>>>,
}

type Subscriber = tokio::sync::mpsc::UnboundedSender<Result<WatchUpdate, StoreError>>;

#[derive(Debug, Default)]
struct Memory {
    gateways: BTreeMap<String, Gateway>,
    revision: i64,
    /// Every call of the reconciler fails UNAVAILABLE.
    down: bool,
    /// Status updates still to answer ABORTED.
    abort_updates: u32,
    /// New watches are refused with this.
    refuse_watch: Option<Status>,
    /// Successful updates by the reconciler role.
    reconciler_writes: u64,
    /// Calls of `get`.
    reads: u64,
}

/// What a backup of a [`MemoryStore`] holds: the gateways and the revision.
#[derive(Debug, Clone)]
pub struct Backup {
    gateways: BTreeMap<String, Gateway>,
    revision: i64,
}

fn rule_status(e: &RuleError) -> Status {
    let message = e.to_string();
    match e {
        RuleError::Invalid(_) => Status::invalid_argument(message),
        RuleError::PermissionDenied { .. } => Status::permission_denied(message),
        RuleError::FailedPrecondition { .. } => Status::failed_precondition(message),
        RuleError::Conflict { .. } => Status::aborted(message),
        RuleError::NotFound(_) => Status::not_found(message),
        RuleError::AlreadyExists(_) => Status::already_exists(message),
    }
}

fn now() -> Timestamp {
    Timestamp::from(std::time::SystemTime::now())
}

impl MemoryStore {
    fn lock(&self) -> MutexGuard<'_, Memory> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn publish(&self, update: &WatchUpdate) {
        let mut subscribers = self.events.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        subscribers.retain(|tx| tx.send(Ok(update.clone())).is_ok());
    }

    fn commit(&self, memory: &mut Memory, write: Write) -> Gateway {
        match write {
            Write::Unchanged(g) => g,
            Write::Put(mut g) => {
                memory.revision += 1;
                let meta = g.metadata.get_or_insert_with(Default::default);
                meta.resource_version = memory.revision;
                memory.gateways.insert(meta.name.clone(), g.clone());
                self.publish(&WatchUpdate::Applied {
                    gateway: g.clone(),
                    revision: memory.revision,
                });
                g
            }
            Write::Remove(mut g) => {
                memory.revision += 1;
                let meta = g.metadata.get_or_insert_with(Default::default);
                meta.resource_version = memory.revision;
                memory.gateways.remove(&meta.name);
                self.publish(&WatchUpdate::Deleted {
                    gateway: g.clone(),
                    revision: memory.revision,
                });
                g
            }
        }
    }

    /// CreateGateway as an editor.
    pub fn create(&self, gateway: Gateway) -> Result<Gateway, Status> {
        let mut memory = self.lock();
        let name = gateway.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
        let uid = format!("uid-{name}-{}", memory.revision + 1);
        let write =
            lifecycle::create(memory.gateways.get(&name), gateway, Role::Editor, uid, now())
                .map_err(|e| rule_status(&e))?;
        Ok(self.commit(&mut memory, write))
    }

    /// UpdateGateway as `role`.
    pub fn update_as(
        &self,
        role: Role,
        gateway: &Gateway,
        paths: &[&str],
    ) -> Result<Gateway, Status> {
        let mut memory = self.lock();
        if memory.down && role == Role::Reconciler {
            return Err(Status::unavailable("the store is down"));
        }
        let name = gateway.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
        let current = memory
            .gateways
            .get(&name)
            .cloned()
            .ok_or_else(|| rule_status(&RuleError::NotFound(name.clone())))?;
        let writes_status = paths.iter().any(|p| p.starts_with("status"));
        if role == Role::Reconciler && writes_status && memory.abort_updates > 0 {
            memory.abort_updates -= 1;
            return Err(Status::aborted("injected: the gateway changed meanwhile"));
        }
        let mask: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
        let write = lifecycle::update(&current, gateway, &mask, role, now())
            .map_err(|e| rule_status(&e))?;
        if role == Role::Reconciler && !matches!(write, Write::Unchanged(_)) {
            memory.reconciler_writes += 1;
        }
        Ok(self.commit(&mut memory, write))
    }

    /// DeleteGateway as an editor.
    pub fn delete(&self, name: &str) -> Result<(), Status> {
        let mut memory = self.lock();
        let current = memory
            .gateways
            .get(name)
            .cloned()
            .ok_or_else(|| rule_status(&RuleError::NotFound(name.to_string())))?;
        let write =
            lifecycle::delete(&current, 0, Role::Editor, now()).map_err(|e| rule_status(&e))?;
        self.commit(&mut memory, write);
        Ok(())
    }

    /// The stored gateway.
    pub fn stored(&self, name: &str) -> Option<Gateway> {
        self.lock().gateways.get(name).cloned()
    }

    /// Makes every call fail UNAVAILABLE (or serve again).
    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// Answers the next `n` status updates ABORTED.
    pub fn abort_next_updates(&self, n: u32) {
        self.lock().abort_updates = n;
    }

    /// Refuses new watches with `status` (`None`: accept again) and ends
    /// the open ones with it.
    pub fn refuse_watches(&self, status: Option<Status>) {
        if let Some(status) = &status {
            let mut subscribers =
                self.events.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for tx in subscribers.drain(..) {
                let _ = tx.send(Err(status.clone().into()));
            }
        }
        self.lock().refuse_watch = status;
    }

    /// A backup of the gateways and the revision now.
    pub fn backup(&self) -> Backup {
        let memory = self.lock();
        Backup { gateways: memory.gateways.clone(), revision: memory.revision }
    }

    /// Puts `backup` back, as a store restored from it: the writes since
    /// are gone and the revision goes back. The open watches end (with
    /// `status` if given, else they are closed); new ones list the restored
    /// gateways.
    pub fn restore(&self, backup: &Backup, status: Option<Status>) {
        let mut memory = self.lock();
        memory.gateways = backup.gateways.clone();
        memory.revision = backup.revision;
        drop(memory);
        let mut subscribers = self.events.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for tx in subscribers.drain(..) {
            if let Some(status) = &status {
                let _ = tx.send(Err(status.clone().into()));
            }
        }
    }

    /// Calls of `get` so far (the reconciler's re-reads).
    pub fn reads(&self) -> u64 {
        self.lock().reads
    }

    /// Updates written by the reconciler role that changed something.
    pub fn reconciler_writes(&self) -> u64 {
        self.lock().reconciler_writes
    }

    /// A new gateway's metadata, for [`MemoryStore::create`].
    pub fn meta(name: &str) -> ObjectMeta {
        ObjectMeta { name: name.into(), ..Default::default() }
    }
}

#[tonic::async_trait]
impl GatewayStore for MemoryStore {
    async fn get(&self, name: &str) -> Result<Gateway, StoreError> {
        let mut memory = self.lock();
        memory.reads += 1;
        if memory.down {
            return Err(Status::unavailable("the store is down").into());
        }
        memory
            .gateways
            .get(name)
            .cloned()
            .ok_or_else(|| rule_status(&RuleError::NotFound(name.to_string())).into())
    }

    async fn update(&self, gateway: Gateway, paths: &[&str]) -> Result<Gateway, StoreError> {
        Ok(self.update_as(Role::Reconciler, &gateway, paths)?)
    }

    fn watch(&self) -> BoxStream<'static, Result<WatchUpdate, StoreError>> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let memory = self.lock();
        if let Some(status) = memory.refuse_watch.clone() {
            let _ = tx.send(Err(status.into()));
            return tokio_stream::wrappers::UnboundedReceiverStream::new(rx).boxed();
        }
        let revision = memory.revision;
        let _ = tx.send(Ok(WatchUpdate::Init { revision }));
        let gateways: Vec<Gateway> = memory.gateways.values().cloned().collect();
        if !gateways.is_empty() {
            let _ = tx.send(Ok(WatchUpdate::InitPage { gateways, revision }));
        }
        let _ = tx.send(Ok(WatchUpdate::InitDone { revision }));
        // Subscribed under the same lock as the snapshot: nothing between.
        self.events.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(tx);
        drop(memory);
        tokio_stream::wrappers::UnboundedReceiverStream::new(rx).boxed()
    }
}
