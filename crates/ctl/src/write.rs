//! The commands that write: create, apply, diff (what apply would write),
//! label, edit, delete, retry.

use std::io::Write;
use std::time::{Duration, SystemTime};

use gantry_api::v1::{CreateGatewayRequest, DeleteGatewayRequest, Gateway, UpdateGatewayRequest};
use prost_types::FieldMask;

use crate::args::{Condition, LabelChange};
use crate::ctl::{dry_run_note, for_each, metadata_write, Ctl};
use crate::errors::{msg, CtlError};
use crate::merge;
use gantry_client::manifest::{self, GatewayDoc};

pub use gantry_api::{LAST_APPLIED_ANNOTATION, RETRY_ANNOTATION};

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

/// The conflict of a file pinned to `pinned` (its
/// `metadata.resourceVersion`) with the gateway at `live` (`None`: gone).
fn stale(name: &str, pinned: i64, live: Option<i64>) -> CtlError {
    let now = match live {
        Some(live) => format!("it is at {live} now"),
        None => "it does not exist now".into(),
    };
    msg(format!(
        "gateway \"{name}\" was changed since the file's metadata.resourceVersion {pinned} ({now}): \
         get it again and reapply, remove resourceVersion from the file, or apply with \
         --force-conflicts to write over the change"
    ))
}

/// Which key-value map of the metadata `label` and `annotate` change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyMap {
    Labels,
    Annotations,
}

impl KeyMap {
    fn path(self) -> &'static str {
        match self {
            KeyMap::Labels => "metadata.labels",
            KeyMap::Annotations => "metadata.annotations",
        }
    }

    fn singular(self) -> &'static str {
        match self {
            KeyMap::Labels => "label",
            KeyMap::Annotations => "annotation",
        }
    }

    fn done(self) -> &'static str {
        match self {
            KeyMap::Labels => "labeled",
            KeyMap::Annotations => "annotated",
        }
    }
}

/// How an `edit` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EditOutcome {
    Edited,
    /// Nothing changed, or the file was emptied.
    Cancelled,
}

impl Ctl {
    /// `create`: creates one gateway; an existing name is refused
    /// (ALREADY_EXISTS), as `kubectl create` does. The gateway as stored
    /// (or, with `dry_run`, as it would be).
    pub async fn create(&self, doc: &GatewayDoc, dry_run: bool) -> Result<Gateway, CtlError> {
        let created = self
            .client
            .clone()
            .create_gateway(CreateGatewayRequest {
                gateway: Some(doc.to_proto()),
                validate_only: dry_run,
            })
            .await
            .map_err(|s| self.fail(s))?;
        Ok(created.into_inner())
    }

    /// What applying `doc` does, as kubectl's client-side apply: creates
    /// it, or merges it three ways into the live gateway (keys the file
    /// dropped since the last apply removed, keys others set kept; see
    /// [`merge::three_way`]) and records it in [`LAST_APPLIED_ANNOTATION`],
    /// or nothing. A `metadata.resourceVersion` in the file makes the write
    /// conditional on it (a stale one is a conflict) unless
    /// `force_conflicts`. With `dry_run` the store answers the would-be
    /// gateway and stores nothing. The verdict and the gateway as it is
    /// (would be) stored.
    pub async fn apply_doc(
        &self,
        doc: &GatewayDoc,
        dry_run: bool,
        force_conflicts: bool,
    ) -> Result<(Verdict, Gateway), CtlError> {
        let name = &doc.metadata.name;
        let to_json = |d: &GatewayDoc| serde_json::to_value(d).map_err(|e| msg(e.to_string()));
        let applied = merge::applied_parts(&to_json(doc)?, LAST_APPLIED_ANNOTATION);
        let record = applied.to_string();
        let pinned = Some(doc.metadata.resource_version).filter(|v| *v != 0 && !force_conflicts);
        let Some(current) = self.get_opt(name).await? else {
            if let Some(pinned) = pinned {
                return Err(stale(name, pinned, None));
            }
            let mut wanted = doc.to_proto();
            let meta = wanted.metadata.get_or_insert_with(Default::default);
            meta.annotations.insert(LAST_APPLIED_ANNOTATION.into(), record);
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
        if let Some(pinned) = pinned.filter(|v| *v != meta.resource_version) {
            return Err(stale(name, pinned, Some(meta.resource_version)));
        }
        let live_doc = GatewayDoc::from_proto(&current);
        let last: Option<serde_json::Value> = meta
            .annotations
            .get(LAST_APPLIED_ANNOTATION)
            .and_then(|r| serde_json::from_str(r).ok());
        let mut merged = merge::three_way(last.as_ref(), &to_json(&live_doc)?, &applied);
        merged["metadata"]["annotations"][LAST_APPLIED_ANNOTATION] = record.into();
        let merged: GatewayDoc = serde_json::from_value(merged).map_err(|e| msg(e.to_string()))?;
        let spec_changed = gantry_core::canonical::spec_changed(
            &current.spec.clone().unwrap_or_default(),
            &merged.to_proto().spec.unwrap_or_default(),
        );
        if !spec_changed
            && merged.metadata.labels == meta.labels
            && merged.metadata.annotations == meta.annotations
        {
            return Ok((Verdict::Unchanged, current));
        }
        let mut update = merged.to_proto();
        update.metadata.get_or_insert_with(Default::default).resource_version =
            pinned.unwrap_or(meta.resource_version);
        let updated = self.write(update, &APPLIED_PATHS, dry_run).await?;
        Ok((Verdict::Configured, updated))
    }

    /// `apply` of one document; answers `gateway/NAME created|configured|unchanged`.
    pub async fn apply(
        &self,
        doc: &GatewayDoc,
        dry_run: bool,
        force_conflicts: bool,
    ) -> Result<String, CtlError> {
        let (verdict, _) = self.apply_doc(doc, dry_run, force_conflicts).await?;
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
        self.write_paths(gateway, paths, dry_run).await.map_err(|s| self.fail(s))
    }

    /// [`Ctl::write`] answering the store's status as it came.
    pub(crate) async fn write_paths(
        &self,
        gateway: Gateway,
        paths: &[&str],
        dry_run: bool,
    ) -> Result<Gateway, tonic::Status> {
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
    }

    /// `diff`: the gateway as stored now (`None` if absent) and as applying
    /// `doc` would store it (the store's dry run), as manifests.
    pub async fn diff(
        &self,
        doc: &GatewayDoc,
    ) -> Result<(Option<GatewayDoc>, GatewayDoc), CtlError> {
        let live = self.get_opt(&doc.metadata.name).await?;
        let (_, would) = self.apply_doc(doc, true, false).await?;
        Ok((live.as_ref().map(GatewayDoc::from_proto), GatewayDoc::from_proto(&would)))
    }

    /// `label` and `annotate`: sets (`k=v`) and removes (`k-`) keys of
    /// the gateway's labels or annotations, conditional on the version
    /// read; an existing key gets another value only with `overwrite`, as
    /// kubectl does.
    pub async fn set_keys(
        &self,
        name: &str,
        map: KeyMap,
        changes: &[LabelChange],
        overwrite: bool,
        dry_run: bool,
    ) -> Result<String, CtlError> {
        let current = self.get(name).await?;
        let meta = current.metadata.unwrap_or_default();
        let before = match map {
            KeyMap::Labels => &meta.labels,
            KeyMap::Annotations => &meta.annotations,
        };
        let mut keys = before.clone();
        for change in changes {
            match change {
                LabelChange::Set(key, value) => {
                    if let Some(old) = keys.get(key).filter(|old| *old != value) {
                        if !overwrite {
                            return Err(msg(format!(
                                "{} {key:?} already has a value ({old}), and --overwrite is false",
                                map.singular()
                            )));
                        }
                    }
                    keys.insert(key.clone(), value.clone());
                }
                LabelChange::Remove(key) => {
                    keys.remove(key);
                }
            }
        }
        if &keys == before {
            return Ok(format!("gateway/{name} not {}", map.done()));
        }
        let update = metadata_write(name, meta.resource_version, |m| match map {
            KeyMap::Labels => m.labels = keys,
            KeyMap::Annotations => m.annotations = keys,
        });
        self.write(update, &[map.path()], dry_run).await?;
        Ok(format!("gateway/{name} {}{}", map.done(), dry_run_note(dry_run)))
    }

    /// `scale`: sets `spec.replicas`, conditional on the version read;
    /// with `current`, only if the gateway has that many now (kubectl's
    /// `--current-replicas`).
    pub async fn scale(
        &self,
        name: &str,
        replicas: i32,
        current: Option<i32>,
        dry_run: bool,
    ) -> Result<String, CtlError> {
        let gateway = self.get(name).await?;
        let spec = gateway.spec.clone().unwrap_or_default();
        if let Some(expected) = current {
            if spec.replicas != Some(expected) {
                let now = spec.replicas.map_or("the default".into(), |r| r.to_string());
                return Err(msg(format!(
                    "gateway/{name} has {now} replicas, not --current-replicas={expected}: nothing changed"
                )));
            }
        }
        let meta = gateway.metadata.unwrap_or_default();
        let update = Gateway {
            metadata: Some(gantry_api::v1::ObjectMeta {
                name: name.into(),
                resource_version: meta.resource_version,
                ..Default::default()
            }),
            spec: Some(gantry_api::v1::GatewaySpec { replicas: Some(replicas), ..spec }),
            status: None,
        };
        self.write(update, &["spec.replicas"], dry_run).await?;
        Ok(format!("gateway/{name} scaled{}", dry_run_note(dry_run)))
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

    /// `delete NAME...`: deletes each (every one tried and reported); with
    /// `wait`, then waits up to that long until those deleted are gone.
    pub async fn delete_all(
        &self,
        names: &[String],
        wait: Option<Duration>,
        dry_run: bool,
        out: &mut impl Write,
        err: &mut impl Write,
    ) -> Result<(), CtlError> {
        if names.is_empty() {
            writeln!(err, "No gateways found.")?;
            return Ok(());
        }
        let deleted = std::cell::RefCell::new(Vec::new());
        let outcome = for_each(
            names,
            |name| format!("gateway/{name}"),
            async |name| {
                let line = self.delete(name, dry_run).await?;
                deleted.borrow_mut().push((*name).clone());
                Ok(line)
            },
            out,
            err,
        )
        .await;
        let deleted = deleted.into_inner();
        if let Some(timeout) = wait.filter(|_| !dry_run && !deleted.is_empty()) {
            self.wait(&deleted, &Condition::Deleted, timeout, out).await?;
        }
        outcome
    }
}
