//! The gantry side of the watch cases reads of each event what the etcd
//! side reads ([`crate::etcd::watch`]): the sender's stamp, nothing else.
//! etcd's side never decodes its values (600 opaque bytes); the gantry
//! client decodes every event into a whole `Gateway` (metadata, maps,
//! status). With the store and the load generator pinned to a core each,
//! that decoding saturated the load generator's core first (9.0 of 10
//! CPU-seconds against the store's 7.0 on 1,000 watches sharing 10
//! streams), so the run measured the client, not the store
//! (docs/benchmarks.md). Here each event decodes into messages holding its
//! gateway's config only; prost skips the other fields.

use std::collections::BTreeMap;

use gantry_api::v1::gateway_service_server::SERVICE_NAME;
use gantry_api::v1::{watch_request, WatchCreate, WatchGatewaysRequest, WatchRequest};
use tokio_stream::StreamExt;
use tonic::transport::Channel;

use crate::versus::Stamps;

/// `gantry.v1.WatchResponse`, as far as the load generator reads it.
#[derive(Clone, PartialEq, prost::Message)]
struct Response {
    #[prost(int64, tag = "1")]
    watch_id: i64,
    #[prost(bool, tag = "2")]
    created: bool,
    #[prost(message, repeated, tag = "7")]
    events: Vec<Event>,
}

/// `gantry.v1.WatchEvent`: its gateway.
#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    #[prost(message, optional, tag = "2")]
    gateway: Option<Gateway>,
}

/// `gantry.v1.Gateway`: its spec.
#[derive(Clone, PartialEq, prost::Message)]
struct Gateway {
    #[prost(message, optional, tag = "2")]
    spec: Option<Spec>,
}

/// `gantry.v1.GatewaySpec`: its config, where the writer puts its stamp.
#[derive(Clone, PartialEq, prost::Message)]
struct Spec {
    #[prost(btree_map = "string, string", tag = "8")]
    config: BTreeMap<String, String>,
}

impl Event {
    /// The sender's clock, in the config key `t` of the gateway's spec.
    fn stamp(&self) -> Option<u64> {
        self.gateway.as_ref()?.spec.as_ref()?.config.get("t")?.parse().ok()
    }
}

/// A client of `channel` for one method of the GatewayService.
async fn grpc(
    channel: Channel,
    method: &str,
) -> anyhow::Result<(tonic::client::Grpc<Channel>, tonic::codegen::http::uri::PathAndQuery)> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| anyhow::anyhow!("gateway-store not ready: {e}"))?;
    Ok((grpc, format!("/{SERVICE_NAME}/{method}").parse()?))
}

/// One WatchGateways stream of every gateway from now on; yields the
/// stamps of each event.
pub(crate) async fn watch(channel: Channel) -> anyhow::Result<Stamps> {
    let (mut grpc, path) = grpc(channel, "WatchGateways").await?;
    let codec = tonic_prost::ProstCodec::<WatchGatewaysRequest, Event>::default();
    let request = tonic::Request::new(WatchGatewaysRequest::default());
    let events = grpc.server_streaming(request, path, codec).await?.into_inner();
    Ok(Box::pin(events.map_while(Result::ok).map(|e| e.stamp().into_iter().collect())))
}

/// `watchers` watches of every gateway carried by one Watch stream over
/// `channel`, as [`crate::etcd::watch_many`] does on etcd; each yields the
/// stamps of its events of each response received.
pub(crate) async fn watch_many(channel: Channel, watchers: usize) -> anyhow::Result<Vec<Stamps>> {
    let (mut grpc, path) = grpc(channel, "Watch").await?;
    let creates: Vec<WatchRequest> = (0..watchers as i64)
        .map(|watch_id| WatchRequest {
            request: Some(watch_request::Request::Create(WatchCreate { watch_id, watch: None })),
        })
        .collect();
    let requests = tokio_stream::iter(creates).chain(tokio_stream::pending());
    let codec = tonic_prost::ProstCodec::<WatchRequest, Response>::default();
    let mut responses =
        grpc.streaming(tonic::Request::new(requests), path, codec).await?.into_inner();
    let mut routes = std::collections::HashMap::new();
    let mut streams = Vec::with_capacity(watchers);
    while routes.len() < watchers {
        match responses.next().await {
            Some(Ok(r)) if r.created => {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u64>>();
                routes.insert(r.watch_id, tx);
                streams
                    .push(Box::pin(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
                        as Stamps);
            }
            other => anyhow::bail!("gantry watch not created: {other:?}"),
        }
    }
    tokio::spawn(async move {
        while let Some(Ok(r)) = responses.next().await {
            let stamps = r.events.iter().filter_map(Event::stamp).collect();
            if let Some(route) = routes.get(&r.watch_id) {
                let _ = route.send(stamps);
            }
        }
    });
    Ok(streams)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_api::v1::{self as api, EventType};
    use prost::Message as _;

    /// A watch response as the store sends it: whole gateways, one of
    /// them written encoded (as the store's fan-out does).
    fn response() -> api::WatchResponse {
        let gateway = |name: &str, stamp: Option<&str>| api::Gateway {
            metadata: Some(api::ObjectMeta {
                name: name.into(),
                uid: "0f8e".into(),
                labels: [("team".to_string(), "t3".to_string())].into(),
                generation: 7,
                ..Default::default()
            }),
            spec: Some(api::GatewaySpec {
                image: "ghcr.io/acme/gateway:1.0".into(),
                config: stamp
                    .map(|t| ("t".to_string(), t.to_string()))
                    .into_iter()
                    .chain([("log.level".to_string(), "debug".to_string())])
                    .collect(),
                ..Default::default()
            }),
            status: Some(api::GatewayStatus { observed_generation: 6, ..Default::default() }),
        };
        let mut encoded = api::WatchEvent {
            encoded_gateway: Some(gateway("b", Some("22")).encode_to_vec().into()),
            ..Default::default()
        };
        encoded.set_type(EventType::Modified);
        api::WatchResponse {
            watch_id: 9,
            events: vec![
                api::WatchEvent { gateway: Some(gateway("a", Some("11"))), ..Default::default() },
                encoded,
                api::WatchEvent { gateway: Some(gateway("c", None)), ..Default::default() },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn the_stamps_read_back_from_whole_gateways_are_the_senders() {
        let bytes = response().encode_to_vec();
        let read = Response::decode(bytes.as_slice()).unwrap();
        assert_eq!((read.watch_id, read.created), (9, false));
        let stamps: Vec<Option<u64>> = read.events.iter().map(Event::stamp).collect();
        assert_eq!(stamps, [Some(11), Some(22), None]);
        let event = Event::decode(response().events[0].encode_to_vec().as_slice()).unwrap();
        assert_eq!(event.stamp(), Some(11));
        let created = api::WatchResponse { watch_id: 3, created: true, ..Default::default() };
        let read = Response::decode(created.encode_to_vec().as_slice()).unwrap();
        assert_eq!((read.watch_id, read.created, read.events.len()), (3, true, 0));
    }
}
