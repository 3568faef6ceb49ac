//! The connected client every command runs on, and what the commands
//! share: reads of one gateway or a listing, metadata-only writes, running
//! a command over several items.

use std::io::Write;

use gantry_api::v1::{Gateway, GetGatewayRequest, ListGatewaysRequest, ObjectMeta};
use gantry_client::GatewayClient;
use tonic::{Code, Status};

use crate::errors::{explain, msg, CtlError};

/// A write of metadata only, conditional on `resource_version`.
pub(crate) fn metadata_write(
    name: &str,
    resource_version: i64,
    set: impl FnOnce(&mut ObjectMeta),
) -> Gateway {
    let mut metadata = ObjectMeta { name: name.into(), resource_version, ..Default::default() };
    set(&mut metadata);
    Gateway { metadata: Some(metadata), ..Default::default() }
}

pub(crate) fn dry_run_note(dry_run: bool) -> &'static str {
    if dry_run {
        " (server dry run)"
    } else {
        ""
    }
}

/// Runs `each` on every item, printing each outcome (successes to `out`,
/// failures to `err`, each naming its item), and fails at the end if any
/// item failed: one bad document or name does not stop the others.
pub async fn for_each<T>(
    items: impl IntoIterator<Item = T>,
    label: impl Fn(&T) -> String,
    each: impl AsyncFn(&T) -> Result<String, CtlError>,
    out: &mut impl Write,
    err: &mut impl Write,
) -> Result<(), CtlError> {
    let (mut failed, mut total) = (0, 0);
    for item in items {
        total += 1;
        match each(&item).await {
            Ok(line) => writeln!(out, "{line}")?,
            Err(e) => {
                failed += 1;
                writeln!(err, "error: {}: {e}", label(&item))?;
            }
        }
        out.flush()?;
    }
    match failed {
        0 => Ok(()),
        _ => Err(CtlError::Failed { failed, total }),
    }
}

/// Context for commands: the client and where it points.
#[derive(Debug, Clone)]
pub struct Ctl {
    pub client: GatewayClient,
    pub server: String,
}

impl Ctl {
    pub(crate) fn fail(&self, status: Status) -> CtlError {
        msg(explain(&status, &self.server))
    }

    pub(crate) async fn get_opt(&self, name: &str) -> Result<Option<Gateway>, CtlError> {
        match self.client.clone().get_gateway(GetGatewayRequest { name: name.into() }).await {
            Ok(g) => Ok(Some(g.into_inner())),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(self.fail(s)),
        }
    }

    pub(crate) async fn get(&self, name: &str) -> Result<Gateway, CtlError> {
        self.get_opt(name).await?.ok_or_else(|| msg(format!("gateway \"{name}\" not found")))
    }

    /// Every gateway `selector` selects, and the revision of the listing.
    pub(crate) async fn list(&self, selector: &str) -> Result<(Vec<Gateway>, i64), CtlError> {
        let (mut out, mut token, mut revision) = (Vec::new(), String::new(), 0);
        loop {
            let page = self
                .client
                .clone()
                .list_gateways(ListGatewaysRequest {
                    page_size: 500,
                    page_token: token,
                    label_selector: selector.into(),
                })
                .await
                .map_err(|s| self.fail(s))?
                .into_inner();
            out.extend(page.gateways);
            if revision == 0 {
                revision = page.resource_version;
            }
            if page.next_page_token.is_empty() {
                return Ok((out, revision));
            }
            token = page.next_page_token;
        }
    }
}
