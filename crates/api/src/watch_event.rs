//! `gantry.v1.WatchEvent`, written by hand rather than generated, so that a
//! sender can put a gateway it already holds encoded on the wire without
//! decoding or encoding it again: the store encodes each change once and
//! every subscriber's stream copies those bytes.
//!
//! Its fields, names and wire encoding are those prost would generate; the
//! one addition is [`WatchEvent::encoded_gateway`].

use prost::bytes::{Buf, BufMut, Bytes};
use prost::encoding::{self, DecodeContext, WireType};
use prost::DecodeError;

use crate::v1::{EventType, Gateway};

/// One change in the store.
#[derive(Clone, PartialEq, Default, Debug)]
pub struct WatchEvent {
    /// An [`EventType`].
    pub r#type: i32,
    /// The object after the change; for DELETED, its last state; for
    /// BOOKMARK, unset.
    pub gateway: Option<Gateway>,
    /// Store revision of this event; for a BOOKMARK, every change up to it
    /// has been delivered.
    pub resource_version: i64,
    /// Set on the BOOKMARK that ends the initial events of
    /// `send_initial_events`.
    pub initial_events_end: bool,
    /// Sending side only: the protobuf encoding of the gateway, written as
    /// field 2 instead of `gateway` when set. Never set by decoding.
    pub encoded_gateway: Option<Bytes>,
}

impl WatchEvent {
    /// The event type; unknown values read as `Unspecified`.
    pub fn r#type(&self) -> EventType {
        EventType::try_from(self.r#type).unwrap_or_default()
    }

    /// Sets the event type.
    pub fn set_type(&mut self, value: EventType) {
        self.r#type = value as i32;
    }
}

impl prost::Message for WatchEvent {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if self.r#type != 0 {
            encoding::int32::encode(1, &self.r#type, buf);
        }
        match (&self.encoded_gateway, &self.gateway) {
            (Some(bytes), _) => encoding::bytes::encode(2, bytes, buf),
            (None, Some(gateway)) => encoding::message::encode(2, gateway, buf),
            (None, None) => {}
        }
        if self.resource_version != 0 {
            encoding::int64::encode(3, &self.resource_version, buf);
        }
        if self.initial_events_end {
            encoding::bool::encode(4, &self.initial_events_end, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let field = |mut e: DecodeError, name: &'static str| {
            e.push("WatchEvent", name);
            e
        };
        match tag {
            1 => encoding::int32::merge(wire_type, &mut self.r#type, buf, ctx)
                .map_err(|e| field(e, "r#type")),
            2 => encoding::message::merge(
                wire_type,
                self.gateway.get_or_insert_with(Gateway::default),
                buf,
                ctx,
            )
            .map_err(|e| field(e, "gateway")),
            3 => encoding::int64::merge(wire_type, &mut self.resource_version, buf, ctx)
                .map_err(|e| field(e, "resource_version")),
            4 => encoding::bool::merge(wire_type, &mut self.initial_events_end, buf, ctx)
                .map_err(|e| field(e, "initial_events_end")),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let kind = if self.r#type != 0 { encoding::int32::encoded_len(1, &self.r#type) } else { 0 };
        let gateway = match (&self.encoded_gateway, &self.gateway) {
            (Some(bytes), _) => encoding::bytes::encoded_len(2, bytes),
            (None, Some(gateway)) => encoding::message::encoded_len(2, gateway),
            (None, None) => 0,
        };
        let revision = if self.resource_version != 0 {
            encoding::int64::encoded_len(3, &self.resource_version)
        } else {
            0
        };
        let end = if self.initial_events_end {
            encoding::bool::encoded_len(4, &self.initial_events_end)
        } else {
            0
        };
        kind + gateway + revision + end
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::ObjectMeta;
    use prost::Message as _;

    fn gateway() -> Gateway {
        Gateway {
            metadata: Some(ObjectMeta { name: "edge".into(), ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn pre_encoded_and_decoded_gateways_encode_to_the_same_bytes_and_decode_back() {
        let decoded = WatchEvent {
            r#type: EventType::Modified as i32,
            gateway: Some(gateway()),
            resource_version: 42,
            initial_events_end: true,
            encoded_gateway: None,
        };
        let pre_encoded = WatchEvent {
            gateway: None,
            encoded_gateway: Some(Bytes::from(gateway().encode_to_vec())),
            ..decoded.clone()
        };
        let bytes = decoded.encode_to_vec();
        assert_eq!(pre_encoded.encode_to_vec(), bytes);
        assert_eq!(pre_encoded.encoded_len(), bytes.len());
        assert_eq!(WatchEvent::decode(bytes.as_slice()).unwrap(), decoded);
        assert_eq!(decoded.r#type(), EventType::Modified);
        assert_eq!(WatchEvent::decode(&[][..]).unwrap(), WatchEvent::default());
    }

    #[test]
    fn a_truncated_gateway_is_a_decode_error_naming_the_field() {
        let mut bytes =
            WatchEvent { gateway: Some(gateway()), ..Default::default() }.encode_to_vec();
        bytes.truncate(bytes.len() - 1);
        let error = WatchEvent::decode(bytes.as_slice()).unwrap_err();
        assert!(error.to_string().contains("WatchEvent.gateway"), "{error}");
    }
}
