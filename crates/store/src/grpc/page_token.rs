//! ListGateways' page tokens: keyset pagination, authenticated.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::Mac as _;
use tonic::Status;

use super::errors::invalid;

/// The opaque `page_token` of ListGateways: the listing's revision and the
/// last name returned (keyset pagination: every later page is read as of
/// that revision), authenticated with the store's key together with the
/// label selector it was issued for, so that a forged, altered or reused
/// token is refused rather than served.
pub(super) struct PageToken;

impl PageToken {
    /// Bytes of the MAC a token carries (the left half of HMAC-SHA256).
    const MAC_BYTES: usize = 16;

    fn mac(key: &[u8], revision: i64, after: &str, selector: &str) -> hmac::Hmac<sha2::Sha256> {
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        for part in [
            b"gantry.dev/page-token/v1".as_slice(),
            &revision.to_be_bytes(),
            after.as_bytes(),
            selector.as_bytes(),
        ] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac
    }

    pub(super) fn encode(key: &[u8], revision: i64, after: &str, selector: &str) -> String {
        let body = URL_SAFE_NO_PAD.encode(format!("{revision}:{after}"));
        let full = Self::mac(key, revision, after, selector).finalize().into_bytes();
        let mac = URL_SAFE_NO_PAD.encode(&full[..Self::MAC_BYTES]);
        format!("{body}.{mac}")
    }

    pub(super) fn decode(key: &[u8], token: &str, selector: &str) -> Result<(i64, String), Status> {
        let bad = || {
            invalid(
                "page_token",
                "not a token this store issued for this label_selector; list again without a page_token",
            )
        };
        let (body, mac) = token.split_once('.').ok_or_else(bad)?;
        let text = String::from_utf8(URL_SAFE_NO_PAD.decode(body).map_err(|_| bad())?)
            .map_err(|_| bad())?;
        let (revision, after) = text.split_once(':').ok_or_else(bad)?;
        let revision: i64 = revision.parse().map_err(|_| bad())?;
        let mac = URL_SAFE_NO_PAD.decode(mac).map_err(|_| bad())?;
        // Constant time (hmac's verify): the comparison must not tell a
        // forger how much of a guess was right.
        if mac.len() != Self::MAC_BYTES
            || Self::mac(key, revision, after, selector).verify_truncated_left(&mac).is_err()
        {
            return Err(bad());
        }
        Ok((revision, after.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_refuse_forged_altered_and_reused_ones() {
        let key = b"store key".as_slice();
        let token = PageToken::encode(key, 42, "edge-7", "env=prod");
        assert_eq!(PageToken::decode(key, &token, "env=prod").unwrap(), (42, "edge-7".to_string()));
        let (body, mac) = token.split_once('.').unwrap();
        let forged_body = URL_SAFE_NO_PAD.encode("999999999:edge-7");
        let refused = [
            ("%%%".to_string(), "env=prod"),
            (body.to_string(), "env=prod"),
            (format!("{forged_body}.{mac}"), "env=prod"),
            (format!("{}.{mac}", URL_SAFE_NO_PAD.encode("-5:edge-7")), "env=prod"),
            (token.clone(), "env=dev"),
            (token.clone(), ""),
            (String::new(), "env=prod"),
        ];
        for (bad, selector) in refused {
            let status = PageToken::decode(key, &bad, selector).unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{bad} {selector}");
        }
        let other_store = PageToken::decode(b"another key", &token, "env=prod").unwrap_err();
        assert_eq!(other_store.code(), tonic::Code::InvalidArgument);
    }
}
