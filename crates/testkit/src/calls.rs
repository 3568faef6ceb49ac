//! The store calls a test makes, one line each: [`Gateways`] wraps a
//! client and answers with the gateway (or panics with the status), so a
//! test reads as its scenario. Both reconciler rigs (in-process against
//! kube-fake, processes against a real control plane) reach the store
//! through it.

use std::time::Duration;

use gantry_api::v1::{
    CreateGatewayRequest, DeleteGatewayRequest, Gateway, GatewaySpec, GetGatewayRequest,
    UpdateGatewayRequest,
};
use gantry_client::GatewayClient;
use prost_types::FieldMask;

use crate::gateway::named;

/// A store's gateways, through `client`.
#[derive(Debug, Clone)]
pub struct Gateways {
    pub client: GatewayClient,
}

impl Gateways {
    pub fn new(client: GatewayClient) -> Self {
        Self { client }
    }

    /// Counts, per gateway, the changes (MODIFIED events) the store makes
    /// after revision `from`, from a watch running in the background: a
    /// write that changes nothing makes no event.
    pub fn count_changes(&self, from: i64) -> Changes {
        use gantry_api::v1::{EventType, WatchGatewaysRequest};
        use tokio_stream::StreamExt;
        let counts = Changes::default();
        let (client, seen) = (self.client.clone(), counts.clone());
        tokio::spawn(async move {
            let request = WatchGatewaysRequest { resource_version: from, ..Default::default() };
            let mut events =
                client.clone().watch_gateways(request).await.expect("watch").into_inner();
            while let Some(Ok(event)) = events.next().await {
                if event.r#type() == EventType::Modified {
                    let Some(gateway) = event.gateway else { continue };
                    let name = gateway.metadata.as_ref().map(|m| m.name.clone());
                    let status = gateway.status.unwrap_or_default();
                    let state = (status.phase(), status.observed_generation, status.message);
                    let mut changes =
                        seen.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    changes.entry(name.unwrap_or_default()).or_default().push(state);
                }
            }
        });
        counts
    }

    /// Creates `gateway`; the stored copy.
    pub async fn create(&self, gateway: impl Into<Gateway>) -> Gateway {
        let request = CreateGatewayRequest { gateway: Some(gateway.into()), validate_only: false };
        self.client.clone().create_gateway(request).await.expect("create the gateway").into_inner()
    }

    /// Creates gateway `name` with `spec`.
    pub async fn create_spec(&self, name: &str, spec: GatewaySpec) -> Gateway {
        self.create(named(name).with_spec(spec)).await
    }

    /// Writes the `paths` of `gateway` (an update mask).
    pub async fn update(&self, gateway: impl Into<Gateway>, paths: &[&str]) -> Gateway {
        let mask = Some(FieldMask { paths: paths.iter().map(|p| p.to_string()).collect() });
        let request = UpdateGatewayRequest {
            gateway: Some(gateway.into()),
            update_mask: mask,
            validate_only: false,
        };
        self.client.clone().update_gateway(request).await.expect("update the gateway").into_inner()
    }

    /// Replaces the spec of `name`.
    pub async fn set_spec(&self, name: &str, spec: GatewaySpec) -> Gateway {
        self.update(named(name).with_spec(spec), &["spec"]).await
    }

    /// The stored gateway, or the store's answer.
    pub async fn get(&self, name: &str) -> Result<Gateway, tonic::Status> {
        let request = GetGatewayRequest { name: name.into() };
        self.client.clone().get_gateway(request).await.map(tonic::Response::into_inner)
    }

    /// Deletes `name` (whatever its version).
    pub async fn delete(&self, name: &str) {
        let request =
            DeleteGatewayRequest { name: name.into(), resource_version: 0, validate_only: false };
        self.client.clone().delete_gateway(request).await.expect("delete the gateway");
    }

    /// Polls until `done` holds for `name`, for at most `patience`; the
    /// failure shows its last status and `explain()`.
    pub async fn wait_for(
        &self,
        name: &str,
        what: &str,
        patience: Duration,
        done: impl Fn(&Gateway) -> bool,
        explain: impl Fn() -> String,
    ) -> Gateway {
        wait_for_gateway(&self.client, name, what, patience, done, explain).await
    }
}

/// Replays the history from the first revision up to `until` and returns
/// its revisions, checking that each event is a creation (the crash and
/// fault tests only create) and that none takes over 30 s to arrive.
pub async fn replay_creations(client: &mut gantry_client::GatewayClient, until: i64) -> Vec<i64> {
    use gantry_api::v1::{EventType, WatchGatewaysRequest};
    use tokio_stream::StreamExt;
    let mut stream = client
        .watch_gateways(WatchGatewaysRequest { resource_version: 1, ..Default::default() })
        .await
        .expect("watch from the first revision")
        .into_inner();
    let mut revisions = Vec::new();
    while revisions.last().is_none_or(|r| *r < until) {
        let event = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("the next event within 30 s")
            .expect("the watch stays open")
            .expect("a watch event");
        assert_eq!(event.r#type(), EventType::Added);
        revisions.push(event.resource_version);
    }
    revisions
}

/// Polls the store until `done` holds for gateway `name`, for at most
/// `patience`; otherwise panics with its last status and `explain()` (for
/// example the reconciler's logs).
pub async fn wait_for_gateway(
    client: &gantry_client::GatewayClient,
    name: &str,
    what: &str,
    patience: Duration,
    done: impl Fn(&gantry_api::v1::Gateway) -> bool,
    explain: impl Fn() -> String,
) -> gantry_api::v1::Gateway {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let request = gantry_api::v1::GetGatewayRequest { name: name.into() };
        let gateway = client.clone().get_gateway(request).await.expect("get the gateway");
        let gateway = gateway.into_inner();
        if done(&gateway) {
            return gateway;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} never became {what}: {:?}\n{}",
            gateway.status,
            explain()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Changes per gateway, counted by [`Gateways::count_changes`].
#[derive(Debug, Clone, Default)]
pub struct Changes(
    std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, Vec<State>>>>,
);

/// A gateway's status after a change: phase, observed generation, message.
pub type State = (gantry_api::v1::Phase, i64, String);

impl Changes {
    /// The number of changes of every gateway so far.
    pub fn all(&self) -> std::collections::BTreeMap<String, u32> {
        let changes = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        changes.iter().map(|(name, states)| (name.clone(), states.len() as u32)).collect()
    }

    /// The changes of `name` so far.
    pub fn of(&self, name: &str) -> u32 {
        self.states(name).len() as u32
    }

    /// The status after each change of `name` so far, in order.
    pub fn states(&self, name: &str) -> Vec<State> {
        let changes = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        changes.get(name).cloned().unwrap_or_default()
    }

    /// How many changes of `name` moved it to another phase or observed
    /// generation (the rest changed only the message: rollout progress, a
    /// spec edit).
    pub fn transitions(&self, name: &str) -> usize {
        let states = self.states(name);
        let mut last = None;
        states
            .iter()
            .filter(|(phase, observed, _)| {
                let moved = last != Some((*phase, *observed));
                last = Some((*phase, *observed));
                moved
            })
            .count()
    }
}
