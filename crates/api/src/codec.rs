//! The protobuf codec of the generated clients and servers: prost's, except
//! that a message that does not decode (invalid UTF-8 in a string, a
//! truncated field, nesting beyond prost's recursion limit) is the peer's
//! fault, answered INVALID_ARGUMENT with prost's description of the field,
//! not INTERNAL. Its encoder starts each response's buffer small.

use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// First capacity of a response's encode buffer. tonic's default (8 KiB)
/// is held by every open stream for as long as it is open: 8 of the 10 KiB
/// of store memory per watcher on a shared connection, for watch events of
/// about a kilobyte. The buffer grows with larger messages (a list page).
pub const ENCODE_BUFFER_BYTES: usize = 1024;

/// tonic's default: encoded messages are handed to HTTP/2 in chunks of at
/// least this many bytes when several are ready.
const YIELD_THRESHOLD_BYTES: usize = 32 * 1024;

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
    type Encoder = ProstEncoder<T>;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::new(ENCODE_BUFFER_BYTES, YIELD_THRESHOLD_BYTES))
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
