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

/// The stamps of the events of each message a watch stream receives.
pub(crate) type Stamps = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Vec<u64>> + Send>>;

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
    let responses = grpc.streaming(tonic::Request::new(requests), path, codec).await?.into_inner();
    route(responses, watchers, |r: &Response| match r.created {
        true => Said::Created(r.watch_id),
        false => Said::Events(r.watch_id, r.events.iter().filter_map(Event::stamp).collect()),
    })
    .await
}

/// What a response of a shared watch stream says, for [`route`].
pub(crate) enum Said {
    /// The watch of this id started.
    Created(i64),
    /// The stamps of events of the watch of this id.
    Events(i64, Vec<u64>),
}

/// `watchers` streams of stamps, one per watch that `responses` (one
/// shared watch stream, gantry's or etcd's) says was created, then each
/// response's stamps routed to its watch's stream.
pub(crate) async fn route<R, S>(
    mut responses: S,
    watchers: usize,
    read: impl Fn(&R) -> Said + Send + 'static,
) -> anyhow::Result<Vec<Stamps>>
where
    R: std::fmt::Debug,
    S: tokio_stream::Stream<Item = Result<R, tonic::Status>> + Unpin + Send + 'static,
{
    let mut routes = std::collections::HashMap::new();
    let mut streams = Vec::with_capacity(watchers);
    while routes.len() < watchers {
        let created = match responses.next().await {
            Some(Ok(r)) => match read(&r) {
                Said::Created(id) => Ok(id),
                Said::Events(..) => Err(format!("{r:?}")),
            },
            other => Err(format!("{other:?}")),
        };
        let id = created.map_err(|r| anyhow::anyhow!("watch not created: {r}"))?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u64>>();
        routes.insert(id, tx);
        streams.push(Box::pin(tokio_stream::wrappers::UnboundedReceiverStream::new(rx)) as Stamps);
    }
    tokio::spawn(async move {
        while let Some(Ok(r)) = responses.next().await {
            if let Said::Events(id, stamps) = read(&r) {
                if let Some(route) = routes.get(&id) {
                    let _ = route.send(stamps);
                }
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

    /// A response of a made-up shared stream: (id, created, stamps).
    type Fake = (i64, bool, Vec<u64>);

    fn said(r: &Fake) -> Said {
        if r.1 {
            Said::Created(r.0)
        } else {
            Said::Events(r.0, r.2.clone())
        }
    }

    #[tokio::test]
    async fn each_watch_gets_the_stamps_of_its_own_responses_in_order() {
        let responses: Vec<Result<Fake, tonic::Status>> = vec![
            Ok((5, true, vec![])),
            Ok((7, true, vec![])),
            Ok((7, false, vec![1, 2])),
            Ok((9, false, vec![99])),
            Ok((5, false, vec![3])),
            Ok((7, false, vec![4])),
        ];
        let streams = route(tokio_stream::iter(responses), 2, said).await.unwrap();
        let mut got = Vec::new();
        for stream in streams {
            got.push(stream.collect::<Vec<Vec<u64>>>().await);
        }
        assert_eq!(got, [vec![vec![3]], vec![vec![1, 2], vec![4]]]);
    }

    #[tokio::test]
    async fn events_before_every_watch_was_created_fail_the_run() {
        let responses: Vec<Result<Fake, tonic::Status>> =
            vec![Ok((5, true, vec![])), Ok((5, false, vec![1]))];
        let error = route(tokio_stream::iter(responses), 2, said).await.err().unwrap();
        assert!(error.to_string().contains("watch not created"), "{error}");
        let ended: Vec<Result<Fake, tonic::Status>> = vec![Ok((5, true, vec![]))];
        assert!(route(tokio_stream::iter(ended), 2, said).await.is_err());
    }
}
