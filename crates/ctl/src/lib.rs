//! gatewayctl: the command line for gantry, in the spirit of kubectl.
//!
//! Each command is a function over a connected client that writes to a
//! given output, so tests run them directly; `main.rs` only parses flags,
//! resolves the context and turns errors into plain messages and exit codes.

#![forbid(unsafe_code)]

pub mod config;
pub mod local;
pub mod manifest;
pub mod output;
pub mod template;

use std::io::Write;
use std::time::{Duration, SystemTime};

use gantry_api::v1::{
    CreateGatewayRequest, DeleteGatewayRequest, EventType, Gateway, GetGatewayRequest,
    ListGatewaysRequest, ObjectMeta, UpdateGatewayRequest, WatchEvent, WatchGatewaysRequest,
};
use gantry_client::GatewayClient;
use prost_types::FieldMask;
use tokio_stream::StreamExt;
use tonic::{Code, Status};
use tonic_types::StatusExt;

use crate::manifest::GatewayDoc;
use crate::output::{Format, PrintOptions};

/// Events `describe` shows.
pub const DESCRIBE_EVENTS: usize = 10;

/// Annotation `retry` sets (the reconciler resets the retry budget when it
/// changes).
pub const RETRY_ANNOTATION: &str = "gantry.dev/retry-requested-at";

/// A failure, in words for the person at the terminal.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("{0}")]
    Message(String),
    #[error("{0}")]
    Manifest(#[from] manifest::ManifestError),
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
    /// Some items of a command over several failed; each was reported.
    #[error("{failed} of {total} failed (each is reported above)")]
    Failed { failed: usize, total: usize },
    /// The failure was reported already: exit non-zero, say nothing more.
    #[error("")]
    Reported,
}

fn msg(text: impl Into<String>) -> CtlError {
    CtlError::Message(text.into())
}

/// The message of `status` and of every error under it: tonic keeps the
/// cause of a transport failure (refused, TLS) in the source chain.
fn chain(status: &Status) -> String {
    let mut text = status.message().to_string();
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        let cause = e.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
        source = e.source();
    }
    text
}

/// What went wrong on the way to the store, when the call never reached
/// it: `None` when the store answered.
fn connection_problem(status: &Status, server: &str) -> Option<String> {
    // A status the store sent has no source; one made by the transport
    // on this side has its cause there.
    std::error::Error::source(status)?;
    let detail = chain(status);
    let lower = detail.to_ascii_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| lower.contains(n));
    let tls = server.starts_with("https://");
    Some(if tls && has(&["invalidcontenttype", "corrupt message", "wrong version number"]) {
        format!("the store at {server} does not speak TLS ({detail}). If it serves plain text, use http:// in --server or the context.")
    } else if tls && has(&["certificate", "unknownissuer", "handshake"]) {
        format!("the TLS certificate of the store at {server} was not accepted ({detail}). Pass the CA that signed it with --ca (GANTRY_CA) or in the context, and use a host name the certificate names.")
    } else if !tls
        && has(&["h2 protocol error", "http2 error", "connection reset", "frame", "broken pipe"])
    {
        format!("the store at {server} broke off the HTTP/2 handshake ({detail}). If it serves TLS, use https:// in --server (with --ca for a private CA).")
    } else if has(&["connection refused"]) {
        format!("nothing is listening at {server} (connection refused). Is gateway-store running there? Check --server or the context in your config.")
    } else if has(&["dns", "failed to lookup", "name or service not known"]) {
        format!("cannot resolve the host of {server} ({detail}). Check --server or the context in your config.")
    } else if has(&["timed out", "timeout"]) {
        format!("the store at {server} did not answer the connection in time ({detail}). Check --server, and that a firewall lets you reach it.")
    } else if has(&["transport", "connect"]) {
        format!("cannot reach the store at {server} ({detail}). Is it running? Check --server or the context in your config.")
    } else {
        return None;
    })
}

/// Explains a gRPC error: what happened and what to do next.
pub fn explain(status: &Status, server: &str) -> String {
    if let Some(problem) = connection_problem(status, server) {
        return problem;
    }
    let detail = status.message();
    match status.code() {
        Code::Unavailable => {
            format!("the store at {server} is unavailable: {detail}. Retry in a moment.")
        }
        Code::Unauthenticated => {
            format!("the store rejected the credentials: {detail}. Check --token (GANTRY_TOKEN) or the context's token.")
        }
        Code::PermissionDenied => format!("not allowed: {detail}"),
        Code::InvalidArgument => {
            let fields: Vec<String> = status
                .get_details_bad_request()
                .map(|b| {
                    b.field_violations
                        .iter()
                        .map(|v| format!("  {}: {}", v.field, v.description))
                        .collect()
                })
                .unwrap_or_default();
            if fields.is_empty() {
                format!("invalid: {detail}")
            } else {
                format!("invalid gateway:\n{}", fields.join("\n"))
            }
        }
        Code::NotFound => detail.to_string(),
        Code::AlreadyExists => detail.to_string(),
        Code::Aborted => format!("{detail} (someone changed it meanwhile; run the command again)"),
        Code::FailedPrecondition => format!("refused: {detail}"),
        Code::DeadlineExceeded => format!("the store at {server} did not answer in time"),
        other => format!("{other:?}: {detail}"),
    }
}

/// What `apply` and `edit` write: the rest belongs to the store and the
/// reconciler.
const APPLIED_PATHS: [&str; 3] = ["spec", "metadata.labels", "metadata.annotations"];

/// The text above the manifest `edit` opens.
pub const EDIT_HEADER: &str =
    "# Edit the gateway below and save; lines starting with '#' are ignored,\n\
# and an empty file cancels. Only spec, labels and annotations are written,\n\
# and only if nobody changed the gateway since it was read.\n";

/// What `apply` did to one document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Created,
    Configured,
    Unchanged,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Created => "created",
            Verdict::Configured => "configured",
            Verdict::Unchanged => "unchanged",
        })
    }
}

/// How an `edit` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EditOutcome {
    Edited,
    /// Nothing changed, or the file was emptied.
    Cancelled,
}

/// One argument of `label`: `key=value` or `key-`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelChange {
    Set(String, String),
    Remove(String),
}

impl std::str::FromStr for LabelChange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match (s.split_once('='), s.strip_suffix('-')) {
            (Some((key, value)), _) if !key.is_empty() => {
                Ok(LabelChange::Set(key.to_string(), value.to_string()))
            }
            (None, Some(key)) if !key.is_empty() => Ok(LabelChange::Remove(key.to_string())),
            _ => Err(format!("{s:?} is neither key=value (set) nor key- (remove)")),
        }
    }
}

/// A write of metadata only, conditional on `resource_version`.
fn metadata_write(name: &str, resource_version: i64, set: impl FnOnce(&mut ObjectMeta)) -> Gateway {
    let mut metadata = ObjectMeta { name: name.into(), resource_version, ..Default::default() };
    set(&mut metadata);
    Gateway { metadata: Some(metadata), ..Default::default() }
}

fn dry_run_note(dry_run: bool) -> &'static str {
    if dry_run {
        " (server dry run)"
    } else {
        ""
    }
}

/// The resource types a name may be prefixed with, as kubectl takes
/// `TYPE/NAME`: `get -o name` prints `gateway/NAME`.
pub const RESOURCE_TYPES: [&str; 3] = ["gateway", "gateways", "gw"];

/// A gateway's name as every command takes it: `NAME` or `gateway/NAME`.
pub fn gateway_name(arg: &str) -> Result<String, String> {
    match arg.split_once('/') {
        None if !arg.is_empty() => Ok(arg.to_string()),
        None => Err("a gateway name is required".into()),
        Some((kind, name)) if RESOURCE_TYPES.contains(&kind) && !name.is_empty() => {
            Ok(name.to_string())
        }
        Some((kind, _)) if RESOURCE_TYPES.contains(&kind) => {
            Err(format!("{arg:?} names no gateway: write gateway/NAME"))
        }
        Some((kind, _)) => Err(format!(
            "unknown resource type {kind:?} in {arg:?}: gatewayctl manages gateways (NAME or gateway/NAME)"
        )),
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
    fn fail(&self, status: Status) -> CtlError {
        msg(explain(&status, &self.server))
    }

    async fn get_opt(&self, name: &str) -> Result<Option<Gateway>, CtlError> {
        match self.client.clone().get_gateway(GetGatewayRequest { name: name.into() }).await {
            Ok(g) => Ok(Some(g.into_inner())),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(self.fail(s)),
        }
    }

    async fn get(&self, name: &str) -> Result<Gateway, CtlError> {
        self.get_opt(name).await?.ok_or_else(|| msg(format!("gateway \"{name}\" not found")))
    }

    /// Every gateway `selector` selects, and the revision of the listing.
    async fn list(&self, selector: &str) -> Result<(Vec<Gateway>, i64), CtlError> {
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

    /// `create`: creates one gateway; an existing name is refused
    /// (ALREADY_EXISTS), as `kubectl create` does.
    pub async fn create(&self, doc: &GatewayDoc, dry_run: bool) -> Result<String, CtlError> {
        self.client
            .clone()
            .create_gateway(CreateGatewayRequest {
                gateway: Some(doc.to_proto()),
                validate_only: dry_run,
            })
            .await
            .map_err(|s| self.fail(s))?;
        Ok(format!("gateway/{} created{}", doc.metadata.name, dry_run_note(dry_run)))
    }

    /// What applying `doc` does: creates it, updates it (spec, labels and
    /// the file's annotations; annotations other tools set are kept), or
    /// nothing; with `dry_run` the store answers the would-be gateway and
    /// stores nothing. The verdict and the gateway as it is (would be)
    /// stored.
    pub async fn apply_doc(
        &self,
        doc: &GatewayDoc,
        dry_run: bool,
    ) -> Result<(Verdict, Gateway), CtlError> {
        let wanted = doc.to_proto();
        let Some(current) = self.get_opt(&doc.metadata.name).await? else {
            let created = self
                .client
                .clone()
                .create_gateway(CreateGatewayRequest {
                    gateway: Some(wanted),
                    validate_only: dry_run,
                })
                .await
                .map_err(|s| self.fail(s))?;
            return Ok((Verdict::Created, created.into_inner()));
        };
        let meta = current.metadata.clone().unwrap_or_default();
        let spec_changed = gantry_core::canonical::spec_changed(
            &current.spec.clone().unwrap_or_default(),
            &wanted.spec.clone().unwrap_or_default(),
        );
        let wanted_meta = wanted.metadata.clone().unwrap_or_default();
        let mut annotations = meta.annotations.clone();
        annotations.extend(wanted_meta.annotations.clone());
        if !spec_changed && meta.labels == wanted_meta.labels && annotations == meta.annotations {
            return Ok((Verdict::Unchanged, current));
        }
        let mut update = wanted;
        let m = update.metadata.get_or_insert_with(Default::default);
        m.resource_version = meta.resource_version;
        m.annotations = annotations;
        let updated = self.write(update, &APPLIED_PATHS, dry_run).await?;
        Ok((Verdict::Configured, updated))
    }

    /// `apply` of one document; answers `gateway/NAME created|configured|unchanged`.
    pub async fn apply(&self, doc: &GatewayDoc, dry_run: bool) -> Result<String, CtlError> {
        let (verdict, _) = self.apply_doc(doc, dry_run).await?;
        Ok(format!("gateway/{} {verdict}{}", doc.metadata.name, dry_run_note(dry_run)))
    }

    /// A conditional update of `paths` (the gateway carries the
    /// resource_version it was read at); with `dry_run`, validated only.
    async fn write(
        &self,
        gateway: Gateway,
        paths: &[&str],
        dry_run: bool,
    ) -> Result<Gateway, CtlError> {
        let mask = Some(FieldMask { paths: paths.iter().map(|p| p.to_string()).collect() });
        self.client
            .clone()
            .update_gateway(UpdateGatewayRequest {
                gateway: Some(gateway),
                update_mask: mask,
                validate_only: dry_run,
            })
            .await
            .map(|r| r.into_inner())
            .map_err(|s| self.fail(s))
    }

    /// `diff`: the gateway as stored now (`None` if absent) and as applying
    /// `doc` would store it (the store's dry run), as manifests.
    pub async fn diff(
        &self,
        doc: &GatewayDoc,
    ) -> Result<(Option<GatewayDoc>, GatewayDoc), CtlError> {
        let live = self.get_opt(&doc.metadata.name).await?;
        let (_, would) = self.apply_doc(doc, true).await?;
        Ok((live.as_ref().map(GatewayDoc::from_proto), GatewayDoc::from_proto(&would)))
    }

    /// `label`: sets (`k=v`) and removes (`k-`) labels, conditional on the
    /// version read; an existing key gets another value only with
    /// `overwrite`, as kubectl does.
    pub async fn label(
        &self,
        name: &str,
        changes: &[LabelChange],
        overwrite: bool,
        dry_run: bool,
    ) -> Result<String, CtlError> {
        let current = self.get(name).await?;
        let meta = current.metadata.unwrap_or_default();
        let mut labels = meta.labels.clone();
        for change in changes {
            match change {
                LabelChange::Set(key, value) => {
                    if let Some(old) = labels.get(key).filter(|old| *old != value) {
                        if !overwrite {
                            return Err(msg(format!(
                                "label {key:?} already has a value ({old}), and --overwrite is false"
                            )));
                        }
                    }
                    labels.insert(key.clone(), value.clone());
                }
                LabelChange::Remove(key) => {
                    labels.remove(key);
                }
            }
        }
        if labels == meta.labels {
            return Ok(format!("gateway/{name} not labeled"));
        }
        let update = metadata_write(name, meta.resource_version, |m| m.labels = labels);
        self.write(update, &["metadata.labels"], dry_run).await?;
        Ok(format!("gateway/{name} labeled{}", dry_run_note(dry_run)))
    }

    /// `edit`: the gateway as a manifest for `edit` to change (it runs the
    /// editor), then the edited manifest written back conditionally on
    /// the version read: a change made meanwhile by anyone else is never
    /// overwritten (ABORTED).
    pub async fn edit(
        &self,
        name: &str,
        edit: impl FnOnce(&str) -> Result<Option<String>, CtlError>,
    ) -> Result<EditOutcome, CtlError> {
        let current = self.get(name).await?;
        let read_at = current.metadata.as_ref().map_or(0, |m| m.resource_version);
        let doc = GatewayDoc::from_proto(&current);
        let text = serde_saphyr::to_string(&doc).map_err(|e| msg(e.to_string()))?;
        let Some(edited) = edit(&format!("{EDIT_HEADER}{text}"))? else {
            return Ok(EditOutcome::Cancelled);
        };
        let kept: String = edited
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect();
        if kept.trim().is_empty() {
            return Ok(EditOutcome::Cancelled);
        }
        let docs = manifest::parse(&kept, "the edited gateway")?;
        let [edited] = docs.as_slice() else {
            return Err(msg("the edited file must hold exactly one gateway"));
        };
        if edited.metadata.name != name {
            return Err(msg(format!(
                "the name cannot be edited ({name} became {})",
                edited.metadata.name
            )));
        }
        let unchanged = edited.spec == doc.spec
            && edited.metadata.labels == doc.metadata.labels
            && edited.metadata.annotations == doc.metadata.annotations;
        if unchanged {
            return Ok(EditOutcome::Cancelled);
        }
        let mut update = edited.to_proto();
        update.metadata.get_or_insert_with(Default::default).resource_version = read_at;
        self.write(update, &APPLIED_PATHS, false).await?;
        Ok(EditOutcome::Edited)
    }

    /// `get`: the named gateways (each missing one reported on `err`) or
    /// the selected list, in a format; the revision to watch from.
    pub async fn get_cmd(
        &self,
        names: &[String],
        selector: &str,
        format: &Format,
        options: &PrintOptions,
        out: &mut impl Write,
        err: &mut impl Write,
    ) -> Result<i64, CtlError> {
        let (gateways, revision, missing) = if names.is_empty() {
            let (gateways, revision) = self.list(selector).await?;
            (gateways, revision, 0)
        } else {
            let (mut found, mut missing) = (Vec::new(), 0);
            for name in names {
                match self.get_opt(name).await? {
                    Some(g) => found.push(g),
                    None => {
                        missing += 1;
                        writeln!(err, "error: gateway \"{name}\" not found")?;
                    }
                }
            }
            let revision =
                found.iter().filter_map(|g| g.metadata.as_ref()).map(|m| m.resource_version).max();
            (found, revision.unwrap_or(0), missing)
        };
        if gateways.is_empty() && names.is_empty() && matches!(format, Format::Table | Format::Wide)
        {
            // A message, not data: kubectl prints it to stderr too.
            writeln!(err, "No gateways found.")?;
            return Ok(revision);
        }
        // A list prints even when empty (an empty GatewayList for json);
        // named gateways that are all missing print nothing.
        if names.is_empty() || !gateways.is_empty() {
            let single = PrintOptions { single: names.len() == 1, ..options.clone() };
            output::print(&gateways, format, &single, out)?;
        }
        match missing {
            0 => Ok(revision),
            1 if names.len() == 1 => Err(CtlError::Reported),
            _ => Err(CtlError::Failed { failed: missing, total: names.len() }),
        }
    }

    /// The changes a watch delivers, bookmarks left out, each failure
    /// explained.
    async fn changes(
        &self,
        request: WatchGatewaysRequest,
    ) -> Result<impl tokio_stream::Stream<Item = Result<WatchEvent, CtlError>> + '_, CtlError> {
        let stream = self
            .client
            .clone()
            .watch_gateways(request)
            .await
            .map_err(|s| self.fail(s))?
            .into_inner();
        Ok(stream
            .filter(|e| !matches!(e, Ok(e) if e.r#type() == EventType::Bookmark))
            .map(move |e| e.map_err(|s| self.fail(s))))
    }

    /// `get --watch`: after the listing (from its revision), each change
    /// as one more row of the same table (or one more object), as
    /// `kubectl get --watch` prints; until interrupted.
    pub async fn get_watch(
        &self,
        names: &[String],
        selector: &str,
        format: &Format,
        options: &PrintOptions,
        after: i64,
        out: &mut impl Write,
    ) -> Result<(), CtlError> {
        let request = WatchGatewaysRequest {
            resource_version: after,
            label_selector: selector.into(),
            name: if names.len() == 1 { names[0].clone() } else { String::new() },
            ..Default::default()
        };
        let mut changes = std::pin::pin!(self.changes(request).await?);
        let rows = PrintOptions { single: true, headers: false, ..options.clone() };
        while let Some(event) = changes.next().await {
            let gateway = event?.gateway.unwrap_or_default();
            let name = gateway.metadata.as_ref().map_or("", |m| m.name.as_str());
            if names.len() > 1 && !names.iter().any(|n| n == name) {
                continue;
            }
            output::print(&[gateway], format, &rows, out)?;
            out.flush()?;
        }
        Ok(())
    }

    /// `describe`: everything about one gateway, for people, with its
    /// recent changes from the store's event history.
    pub async fn describe(&self, name: &str, out: &mut impl Write) -> Result<(), CtlError> {
        let gateway = self.get(name).await?;
        output::describe(&gateway, out)?;
        let events = self
            .recent_events(name, gateway.metadata.as_ref().map_or(0, |m| m.resource_version))
            .await;
        writeln!(out, "Events:")?;
        match events {
            Some(events) if !events.is_empty() => {
                writeln!(out, "  {:<10} {:<9} {:<13} GEN/OBSERVED", "REVISION", "EVENT", "PHASE")?;
                for e in events.iter().rev().take(DESCRIBE_EVENTS).rev() {
                    writeln!(out, "  {e}")?;
                }
            }
            Some(_) => writeln!(out, "  <none retained>")?,
            None => writeln!(out, "  <history not available>")?,
        }
        Ok(())
    }

    /// The retained changes of one gateway up to `until` (its current
    /// revision), oldest first; `None` when the history cannot be read.
    async fn recent_events(&self, name: &str, until: i64) -> Option<Vec<String>> {
        let request =
            WatchGatewaysRequest { resource_version: 1, name: name.into(), ..Default::default() };
        let mut stream = self.client.clone().watch_gateways(request).await.ok()?.into_inner();
        let mut lines = Vec::new();
        let read = async {
            while let Some(Ok(event)) = stream.next().await {
                let revision = event.resource_version;
                let kind = event.r#type();
                let g = event.gateway.unwrap_or_default();
                let status = g.status.unwrap_or_default();
                lines.push(format!(
                    "{:<10} {:<9} {:<13} {}/{}",
                    revision,
                    kind.as_str_name().trim_start_matches("EVENT_TYPE_"),
                    status.phase().as_str_name().trim_start_matches("PHASE_"),
                    g.metadata.map_or(0, |m| m.generation),
                    status.observed_generation
                ));
                if revision >= until {
                    break;
                }
            }
        };
        // History older than the store retains answers OUT_OF_RANGE; a slow
        // read is cut short rather than hanging describe.
        tokio::time::timeout(Duration::from_secs(3), read).await.ok()?;
        Some(lines)
    }

    /// `delete` of one gateway: requests its deletion.
    pub async fn delete(&self, name: &str, dry_run: bool) -> Result<String, CtlError> {
        self.client
            .clone()
            .delete_gateway(DeleteGatewayRequest {
                name: name.into(),
                resource_version: 0,
                validate_only: dry_run,
            })
            .await
            .map_err(|s| self.fail(s))?;
        Ok(format!("gateway/{name} deleted{}", dry_run_note(dry_run)))
    }

    /// The names of every gateway `selector` selects (`""`: all).
    pub async fn names(&self, selector: &str) -> Result<Vec<String>, CtlError> {
        let (gateways, _) = self.list(selector).await?;
        Ok(gateways.into_iter().filter_map(|g| g.metadata.map(|m| m.name)).collect())
    }

    /// The server's version, from the header every answer of the store
    /// carries.
    pub async fn server_version(&self) -> Result<String, CtlError> {
        let request = ListGatewaysRequest { page_size: 1, ..Default::default() };
        let metadata = match self.client.clone().list_gateways(request).await {
            Ok(answer) => answer.metadata().clone(),
            // A refusal (no token) still says who answered.
            Err(status) if status.metadata().contains_key(gantry_api::VERSION_HEADER) => {
                status.metadata().clone()
            }
            Err(status) => return Err(self.fail(status)),
        };
        metadata
            .get(gantry_api::VERSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
            .ok_or_else(|| msg("the store did not say its version (older than this header)"))
    }

    /// `retry`: asks the reconciler to try again now, resetting its retry
    /// budget, without a spec change.
    pub async fn retry(&self, name: &str, out: &mut impl Write) -> Result<(), CtlError> {
        let current = self.get(name).await?;
        let meta = current.metadata.unwrap_or_default();
        let mut annotations = meta.annotations;
        annotations.insert(
            RETRY_ANNOTATION.into(),
            prost_types::Timestamp::from(SystemTime::now()).to_string(),
        );
        let update = metadata_write(name, meta.resource_version, |m| m.annotations = annotations);
        self.write(update, &["metadata.annotations"], false).await?;
        writeln!(out, "gateway/{name} retry requested")?;
        Ok(())
    }

    /// `wait`: until every gateway meets `condition`, or `timeout`.
    pub async fn wait(
        &self,
        names: &[String],
        condition: &Condition,
        timeout: Duration,
        out: &mut impl Write,
    ) -> Result<(), CtlError> {
        let deadline = tokio::time::Instant::now() + timeout;
        for name in names {
            loop {
                let current = self.get_opt(name).await?;
                let met = match (condition, &current) {
                    (Condition::Deleted, None) => true,
                    (_, None) => return Err(msg(format!("gateway \"{name}\" not found"))),
                    (Condition::Deleted, Some(_)) => false,
                    (Condition::Converged, Some(g)) => {
                        let generation = g.metadata.as_ref().map_or(0, |m| m.generation);
                        g.status.as_ref().is_some_and(|s| s.observed_generation == generation)
                    }
                    (Condition::Named(kind), Some(g)) => g.status.as_ref().is_some_and(|s| {
                        let generation = g.metadata.as_ref().map_or(0, |m| m.generation);
                        s.observed_generation == generation
                            && s.conditions.iter().any(|c| {
                                c.r#type.eq_ignore_ascii_case(kind)
                                    && c.status() == gantry_api::v1::ConditionStatus::True
                            })
                    }),
                };
                if met {
                    writeln!(out, "gateway/{name} condition met")?;
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    let state = current
                        .and_then(|g| g.status)
                        .map(|s| {
                            format!(
                                "phase {}, {}",
                                s.phase().as_str_name().trim_start_matches("PHASE_"),
                                s.message
                            )
                        })
                        .unwrap_or_else(|| "no status yet".into());
                    return Err(msg(format!("timed out after {timeout:?} waiting for gateway/{name} ({condition}): {state}")));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// `watch`: prints every change as it comes, until interrupted.
    pub async fn watch(
        &self,
        selector: &str,
        name: Option<&str>,
        out: &mut impl Write,
    ) -> Result<(), CtlError> {
        let request = WatchGatewaysRequest {
            resource_version: 0,
            send_initial_events: true,
            allow_bookmarks: false,
            label_selector: selector.into(),
            name: name.unwrap_or_default().into(),
        };
        let mut changes = std::pin::pin!(self.changes(request).await?);
        writeln!(
            out,
            "{:<10} {:<9} {:<30} {:<13} GEN/OBSERVED",
            "REVISION", "EVENT", "NAME", "PHASE"
        )?;
        while let Some(event) = changes.next().await {
            let event = event?;
            let kind = event.r#type();
            let g = event.gateway.unwrap_or_default();
            let meta = g.metadata.unwrap_or_default();
            let status = g.status.unwrap_or_default();
            writeln!(
                out,
                "{:<10} {:<9} {:<30} {:<13} {}/{}",
                event.resource_version,
                kind.as_str_name().trim_start_matches("EVENT_TYPE_"),
                meta.name,
                status.phase().as_str_name().trim_start_matches("PHASE_"),
                meta.generation,
                status.observed_generation
            )?;
            out.flush()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_text_call_broken_off_by_a_tls_store_says_use_https() {
        // What the transport reports depends on who closes first: a reset,
        // a frame error or, writing after the store closed, a broken pipe.
        for cause in ["connection reset by peer", "frame with invalid size", "broken pipe"] {
            let io = std::io::Error::other(format!("transport error: {cause}"));
            let status = Status::from_error(Box::new(io));
            let said = connection_problem(&status, "http://store:50051").unwrap();
            assert!(said.contains("use https://"), "{cause}: {said}");
        }
    }

    #[test]
    fn a_name_is_taken_bare_or_as_kubectl_prints_it() {
        for arg in ["edge", "gateway/edge", "gateways/edge", "gw/edge"] {
            assert_eq!(gateway_name(arg).as_deref(), Ok("edge"), "{arg}");
        }
        for arg in ["", "gateway/", "pod/edge", "gantry.dev/edge"] {
            let refused = gateway_name(arg).unwrap_err();
            assert!(refused.to_lowercase().contains("name"), "{arg}: {refused}");
        }
        assert!(gateway_name("pod/edge").unwrap_err().contains("gateway/NAME"));
    }
}

/// What `wait --for` waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// `condition=<Type>`: the condition is True for the current generation.
    Named(String),
    /// `converged`: observed_generation == generation.
    Converged,
    /// `delete`: the gateway is gone.
    Deleted,
}

impl std::str::FromStr for Condition {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "converged" => Ok(Condition::Converged),
            "delete" => Ok(Condition::Deleted),
            other => match other.strip_prefix("condition=") {
                Some(kind) if !kind.is_empty() => Ok(Condition::Named(kind.into())),
                _ => Err(format!(
                    "unknown condition {other:?}: use condition=Ready, converged or delete"
                )),
            },
        }
    }
}

impl std::fmt::Display for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Condition::Named(k) => write!(f, "condition={k}"),
            Condition::Converged => f.write_str("converged"),
            Condition::Deleted => f.write_str("delete"),
        }
    }
}
