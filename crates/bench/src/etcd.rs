//! The etcd side of `gantry-bench versus`: a client for the subset of
//! etcd's v3 API in `proto/etcd.proto`.

use std::time::Instant;

use tokio_stream::StreamExt as _;
use tonic::transport::Channel;

use crate::stamps::{route, Said, Stamps};

#[allow(clippy::all, clippy::pedantic, missing_docs)]
mod pb {
    tonic::include_proto!("etcdserverpb");
}

pub type Kv = pb::kv_client::KvClient<Channel>;

/// Writes `key` = `value`; returns once etcd has committed it.
pub async fn put(kv: &mut Kv, key: &str, value: &[u8]) -> Result<(), tonic::Status> {
    kv.put(pb::PutRequest { key: key.into(), value: value.to_vec(), ..Default::default() })
        .await
        .map(drop)
}

/// A value of `size` bytes that starts with `micros` (the sender's clock,
/// for write → receive latency).
pub fn stamped_value(micros: u64, size: usize) -> Vec<u8> {
    let mut value = format!("{micros:020}").into_bytes();
    value.resize(size.max(20), b'x');
    value
}

/// The sender's clock in a value from [`stamped_value`].
pub fn stamp(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value.get(..20)?).ok()?.parse().ok()
}

/// One watch stream on `key` over `channel`; yields the stamps of the
/// events of each response received, until the stream ends.
pub async fn watch(
    channel: Channel,
    key: &str,
) -> anyhow::Result<impl tokio_stream::Stream<Item = Vec<u64>>> {
    let create = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
            pb::WatchCreateRequest { key: key.into(), ..Default::default() },
        )),
    };
    // The request side stays open: etcd ends the watch when it closes.
    let requests = tokio_stream::once(create).chain(tokio_stream::pending());
    let mut responses =
        pb::watch_client::WatchClient::new(channel).watch(requests).await?.into_inner();
    let started = Instant::now();
    match responses.next().await {
        Some(Ok(r)) if r.created => {}
        other => anyhow::bail!("etcd watch not created after {:?}: {other:?}", started.elapsed()),
    }
    Ok(responses
        .map_while(Result::ok)
        .map(|r| r.events.iter().filter_map(|e| stamp(&e.kv.as_ref()?.value)).collect()))
}

/// `watchers` watches on `key` carried by one Watch stream over `channel`,
/// as etcd's Go client shares a stream among the watches of a context;
/// each yields the stamps of its events of each response received.
pub async fn watch_many(
    channel: Channel,
    key: &str,
    watchers: usize,
) -> anyhow::Result<Vec<Stamps>> {
    let create = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
            pb::WatchCreateRequest { key: key.into(), ..Default::default() },
        )),
    };
    let creates: Vec<_> = std::iter::repeat_n(create, watchers).collect();
    let requests = tokio_stream::iter(creates).chain(tokio_stream::pending());
    let responses = pb::watch_client::WatchClient::new(channel).watch(requests).await?.into_inner();
    // etcd answers the creates in order, each with the id it gave.
    route(responses, watchers, |r: &pb::WatchResponse| match r.created {
        true => Said::Created(r.watch_id),
        false => Said::Events(
            r.watch_id,
            r.events.iter().filter_map(|e| stamp(&e.kv.as_ref()?.value)).collect(),
        ),
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_read_back_from_a_padded_value() {
        let v = stamped_value(1_234_567, 600);
        assert_eq!(v.len(), 600);
        assert_eq!(stamp(&v), Some(1_234_567));
        assert_eq!(stamp(b"short"), None);
    }
}
