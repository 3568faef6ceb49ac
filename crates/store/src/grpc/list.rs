//! ListGateways: pages of gateways in name order, every page of a listing
//! read as of its first page's revision, bounded in count and bytes.

use gantry_api::v1::{ListGatewaysRequest, ListGatewaysResponse};
use gantry_core::Selector;
use tonic::Status;

use super::errors::{invalid, storage_status};
use super::page_token::PageToken;
use crate::storage::{Page, Storage};

/// Default and maximum `page_size` of ListGateways.
pub const DEFAULT_PAGE_SIZE: usize = 100;
pub const MAX_PAGE_SIZE: usize = 1000;
/// A page stops before it would exceed this many encoded bytes (it always
/// holds at least one gateway, itself at most 1 MiB), so a response stays
/// under the 4 MiB a default gRPC client accepts.
pub const PAGE_BYTE_BUDGET: usize = 2 * 1024 * 1024;

/// The page size a request asks for, as served (a negative one is refused
/// by [`list`]; here it counts as the default).
pub fn effective_page_size(requested: i32) -> usize {
    match requested {
        n if n <= 0 => DEFAULT_PAGE_SIZE,
        n => usize::try_from(n).unwrap_or(MAX_PAGE_SIZE).min(MAX_PAGE_SIZE),
    }
}

pub(super) async fn list(
    storage: &dyn Storage,
    request: ListGatewaysRequest,
) -> Result<ListGatewaysResponse, Status> {
    if request.page_size < 0 {
        return Err(invalid("page_size", "must be 0 (default 100) or more"));
    }
    let page_size = effective_page_size(request.page_size);
    let selector = Selector::parse(&request.label_selector)
        .map_err(|e| invalid("label_selector", e.to_string()))?;
    let key = storage.page_token_key();
    let (mut after, mut revision) = match request.page_token.as_str() {
        "" => (String::new(), None),
        token => {
            let (revision, after) = PageToken::decode(key, token, &request.label_selector)?;
            (after, Some(revision))
        }
    };
    let batch = if selector.is_empty() { page_size + 1 } else { (page_size + 1).max(500) };
    let mut gateways = Vec::new();
    let mut bytes = 0;
    let mut more = false;
    'scan: loop {
        let page = Page { after: &after, limit: batch, max_bytes: PAGE_BYTE_BUDGET, at: revision };
        let snapshot = storage.list(page).await.map_err(storage_status)?;
        revision.get_or_insert(snapshot.revision);
        let exhausted = !snapshot.more;
        for gateway in snapshot.gateways {
            if !selector.matches(&gateway.labels) {
                after = gateway.name;
                continue;
            }
            let size = gateway.encoded.len();
            if gateways.len() == page_size
                || (bytes + size > PAGE_BYTE_BUDGET && !gateways.is_empty())
            {
                more = true;
                break 'scan;
            }
            bytes += size;
            after = gateway.name;
            gateways.push(gateway.encoded);
        }
        if exhausted {
            break;
        }
    }
    let revision = revision.unwrap_or_default();
    let next_page_token = if more {
        PageToken::encode(key, revision, &after, &request.label_selector)
    } else {
        String::new()
    };
    // The stored encodings, copied into the answer as they are: nothing is
    // encoded again on the thread that writes it.
    Ok(ListGatewaysResponse {
        encoded_gateways: gateways,
        next_page_token,
        resource_version: revision,
        ..Default::default()
    })
}
