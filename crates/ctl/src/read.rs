//! The commands that read: get (and --watch), describe, wait, watch,
//! version.

use std::io::Write;
use std::time::Duration;

use gantry_api::v1::{EventType, ListGatewaysRequest, WatchEvent, WatchGatewaysRequest};
use tokio_stream::StreamExt;

use crate::args::Condition;
use crate::ctl::Ctl;
use crate::errors::{msg, CtlError};
use crate::output::{self, Format, PrintOptions};
use gantry_client::manifest::GatewayDoc;

/// Events `describe` shows.
pub const DESCRIBE_EVENTS: usize = 10;

/// `describe` reads at most this many of the store's latest revisions for
/// a gateway's events (the store filters them by name).
const EVENTS_WINDOW: i64 = 10_000;

/// The oldest revision a refused watch can start from: the compaction mark
/// the store names with `REVISION_COMPACTED`.
fn compaction_mark(status: &tonic::Status) -> Option<i64> {
    use tonic_types::StatusExt as _;
    if !gantry_client::watch::is_compacted(status) {
        return None;
    }
    let info = status.get_details_error_info()?;
    info.metadata.get("compacted_revision")?.parse().ok()
}

impl Ctl {
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
            let single = PrintOptions { single: names.len() == 1, revision, ..options.clone() };
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
    /// revision), oldest first; `None` when the history cannot be read. It
    /// reads at most the last [`EVENTS_WINDOW`] revisions of the store, and
    /// from the store's compaction mark when older ones are gone.
    async fn recent_events(&self, name: &str, until: i64) -> Option<Vec<String>> {
        let mut from = (until - EVENTS_WINDOW).max(1);
        for _ in 0..2 {
            match self.events_between(name, from, until).await {
                Ok(lines) => return Some(lines),
                Err(status) => from = compaction_mark(&status)?,
            }
        }
        None
    }

    /// The changes of `name` after revision `from` up to `until`, as lines.
    async fn events_between(
        &self,
        name: &str,
        from: i64,
        until: i64,
    ) -> Result<Vec<String>, tonic::Status> {
        let request = WatchGatewaysRequest {
            resource_version: from,
            name: name.into(),
            ..Default::default()
        };
        let mut stream = self.client.clone().watch_gateways(request).await?.into_inner();
        let mut lines = Vec::new();
        let read = async {
            while let Some(event) = stream.next().await {
                let event = event?;
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
            Ok::<(), tonic::Status>(())
        };
        // A slow read is cut short rather than hanging describe.
        match tokio::time::timeout(Duration::from_secs(3), read).await {
            Ok(Err(status)) => Err(status),
            Ok(Ok(())) => Ok(lines),
            Err(_) => Err(tonic::Status::deadline_exceeded("the history took too long to read")),
        }
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
                    (Condition::JsonPath { path, value, .. }, Some(g)) => {
                        let doc = serde_json::to_value(GatewayDoc::from_proto(g))
                            .map_err(|e| msg(e.to_string()))?;
                        Condition::json_path_met(path, value.as_deref(), &doc)
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
