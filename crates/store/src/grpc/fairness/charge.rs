//! What an answer costs its priority level: its encoded bytes, each
//! object at least [`OBJECT_CHARGE`].

use gantry_api::v1::{Gateway, ListGatewaysResponse};
use prost::Message as _;

/// The least an object in an answer is charged, whatever its size.
pub const OBJECT_CHARGE: usize = 1024;

/// What an answer is charged against its level's byte rate.
pub trait Charge {
    /// Its encoded bytes, each object in it at least [`OBJECT_CHARGE`].
    fn charge(&self) -> usize;
}

impl Charge for Gateway {
    fn charge(&self) -> usize {
        self.encoded_len().max(OBJECT_CHARGE)
    }
}

impl Charge for ListGatewaysResponse {
    fn charge(&self) -> usize {
        let encoded = self.encoded_gateways.iter().map(|g| g.len().max(OBJECT_CHARGE));
        let decoded = self.gateways.iter().map(Charge::charge);
        encoded.chain(decoded).sum::<usize>()
            + self.next_page_token.len()
            + std::mem::size_of_val(&self.resource_version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_charged_its_bytes_and_each_object_at_least_a_kib() {
        let small = Gateway::default();
        assert_eq!(small.charge(), OBJECT_CHARGE);
        let big = Gateway {
            metadata: Some(gantry_api::v1::ObjectMeta {
                name: "x".repeat(5000),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(big.charge(), big.encoded_len());
        let page = ListGatewaysResponse {
            encoded_gateways: vec![small.encode_to_vec().into(), big.encode_to_vec().into()],
            next_page_token: "t".repeat(10),
            resource_version: 7,
            ..Default::default()
        };
        assert_eq!(page.charge(), OBJECT_CHARGE + big.encoded_len() + 10 + 8);
    }
}
