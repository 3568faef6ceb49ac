//! The protobuf codec of the generated clients and servers: prost's, except
//! that a message that does not decode (invalid UTF-8 in a string, a
//! truncated field, nesting beyond prost's recursion limit) is the peer's
//! fault, answered INVALID_ARGUMENT with prost's description of the field,
//! not INTERNAL.

use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::{ProstCodec, ProstDecoder};

/// [`ProstCodec`] with decode failures reported as INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct StrictCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Default for StrictCodec<T, U> {
    fn default() -> Self {
        Self(ProstCodec::default())
    }
}

impl<T, U> Codec for StrictCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder(self.0.decoder())
    }
}

/// Decoder of [`StrictCodec`].
#[derive(Debug, Clone)]
pub struct StrictDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| match status.code() {
            Code::Internal => Status::invalid_argument(format!(
                "the message is not a valid protobuf encoding of the expected type: {}",
                status.message().trim_start_matches("failed to decode Protobuf message: ")
            )),
            _ => status,
        })
    }

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        self.0.buffer_settings()
    }
}
