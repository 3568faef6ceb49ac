//! gRPC calls carrying raw protobuf bytes: hostile input a typed client
//! cannot send, and load that does not pay for decoding what it gets back.

use prost::bytes::{Buf, BufMut};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;

/// Sends and receives raw protobuf bytes.
#[derive(Debug, Clone, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        Ok(Some(buf.copy_to_bytes(buf.remaining()).to_vec()))
    }
}

/// A connection to `endpoint` (`http://HOST:PORT`).
pub async fn connect(endpoint: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(endpoint.to_string())
        .expect("an endpoint URL")
        .connect()
        .await
        .expect("connect")
}

/// Calls `gantry.v1.GatewayService/{method}` with `body` (and `token` as
/// the bearer token): the answer's bytes.
pub async fn call(
    channel: Channel,
    method: &str,
    body: Vec<u8>,
    token: Option<&str>,
) -> Result<Vec<u8>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel).max_encoding_message_size(64 << 20);
    grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = format!("/gantry.v1.GatewayService/{method}").parse().expect("a method path");
    let mut request = tonic::Request::new(body);
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().expect("an ASCII token");
        request.metadata_mut().insert("authorization", value);
    }
    grpc.unary(request, path, RawCodec).await.map(tonic::Response::into_inner)
}
