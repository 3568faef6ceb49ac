//! `gantry.v1.ListGatewaysResponse`, written by hand rather than generated,
//! so that the store can answer a listing with the gateways' bytes as it
//! stored them: encoding a page is then a copy, done where the page was
//! read, not a re-encoding of every object on the thread that writes the
//! answer.
//!
//! Its fields, names and wire encoding are those prost would generate; the
//! one addition is [`ListGatewaysResponse::encoded_gateways`].

use prost::bytes::{Buf, BufMut, Bytes};
use prost::encoding::{self, DecodeContext, WireType};
use prost::DecodeError;

use crate::v1::Gateway;

/// A page of gateways, in name order.
#[derive(Clone, PartialEq, Default, Debug)]
pub struct ListGatewaysResponse {
    pub gateways: Vec<Gateway>,
    /// Token of the next page; empty on the last page.
    pub next_page_token: String,
    /// Store revision of the listing (of its first page): watch from here.
    pub resource_version: i64,
    /// Sending side only: protobuf encodings of gateways, written as
    /// field 1 (each one element of `gateways`) before `gateways` itself.
    /// Never set by decoding.
    pub encoded_gateways: Vec<Bytes>,
}

impl prost::Message for ListGatewaysResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        for bytes in &self.encoded_gateways {
            encoding::bytes::encode(1, bytes, buf);
        }
        for gateway in &self.gateways {
            encoding::message::encode(1, gateway, buf);
        }
        if !self.next_page_token.is_empty() {
            encoding::string::encode(2, &self.next_page_token, buf);
        }
        if self.resource_version != 0 {
            encoding::int64::encode(3, &self.resource_version, buf);
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
            e.push("ListGatewaysResponse", name);
            e
        };
        match tag {
            1 => encoding::message::merge_repeated(wire_type, &mut self.gateways, buf, ctx)
                .map_err(|e| field(e, "gateways")),
            2 => encoding::string::merge(wire_type, &mut self.next_page_token, buf, ctx)
                .map_err(|e| field(e, "next_page_token")),
            3 => encoding::int64::merge(wire_type, &mut self.resource_version, buf, ctx)
                .map_err(|e| field(e, "resource_version")),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let encoded: usize =
            self.encoded_gateways.iter().map(|b| encoding::bytes::encoded_len(1, b)).sum();
        let token = if self.next_page_token.is_empty() {
            0
        } else {
            encoding::string::encoded_len(2, &self.next_page_token)
        };
        let revision = if self.resource_version != 0 {
            encoding::int64::encoded_len(3, &self.resource_version)
        } else {
            0
        };
        encoded + encoding::message::encoded_len_repeated(1, &self.gateways) + token + revision
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

    fn gateway(name: &str) -> Gateway {
        Gateway {
            metadata: Some(ObjectMeta { name: name.into(), ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn pre_encoded_and_decoded_pages_encode_to_the_same_bytes_and_decode_back() {
        let decoded = ListGatewaysResponse {
            gateways: vec![gateway("a"), gateway("b"), gateway("c")],
            next_page_token: "next".into(),
            resource_version: 42,
            encoded_gateways: Vec::new(),
        };
        let pre_encoded = ListGatewaysResponse {
            gateways: vec![gateway("c")],
            encoded_gateways: ["a", "b"]
                .iter()
                .map(|n| Bytes::from(gateway(n).encode_to_vec()))
                .collect(),
            ..decoded.clone()
        };
        let bytes = decoded.encode_to_vec();
        assert_eq!(pre_encoded.encode_to_vec(), bytes);
        assert_eq!(pre_encoded.encoded_len(), bytes.len());
        assert_eq!(ListGatewaysResponse::decode(bytes.as_slice()).unwrap(), decoded);
        assert_eq!(ListGatewaysResponse::decode(&[][..]).unwrap(), ListGatewaysResponse::default());
    }

    #[test]
    fn a_truncated_gateway_is_a_decode_error_naming_the_field() {
        let mut bytes = ListGatewaysResponse { gateways: vec![gateway("a")], ..Default::default() }
            .encode_to_vec();
        bytes.truncate(bytes.len() - 1);
        let error = ListGatewaysResponse::decode(bytes.as_slice()).unwrap_err();
        assert!(error.to_string().contains("ListGatewaysResponse.gateways"), "{error}");
    }
}
