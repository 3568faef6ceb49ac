//! The directory target: each gateway's manifests as YAML files under
//! `<dir>/<gateway>/`, each written to a temporary file and renamed into
//! place, so a reader never sees half a file.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{Owner, Target, TargetError};
use crate::render::{file_name, Rendered};
use crate::status::{Observation, Workload};

/// Manifests in a directory.
#[derive(Debug, Clone)]
pub struct DirectoryTarget {
    root: PathBuf,
}

fn io_error(context: &str, path: &Path, e: std::io::Error) -> TargetError {
    TargetError(format!("{context} {}: {e}", path.display()))
}

/// The YAML of one manifest.
pub fn to_yaml(manifest: &Value) -> Result<String, TargetError> {
    serde_saphyr::to_string(manifest).map_err(|e| TargetError(format!("cannot render YAML: {e}")))
}

impl DirectoryTarget {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    fn dir(&self, gateway: &str) -> PathBuf {
        self.root.join(gateway)
    }

    async fn write_atomic(path: &Path, contents: &str) -> Result<(), TargetError> {
        let tmp = path.with_extension(format!("yaml.tmp-{}", std::process::id()));
        tokio::fs::write(&tmp, contents).await.map_err(|e| io_error("cannot write", &tmp, e))?;
        let file =
            tokio::fs::File::open(&tmp).await.map_err(|e| io_error("cannot open", &tmp, e))?;
        file.sync_all().await.map_err(|e| io_error("cannot sync", &tmp, e))?;
        tokio::fs::rename(&tmp, path).await.map_err(|e| io_error("cannot rename into", path, e))
    }

    async fn files(dir: &Path) -> Result<Vec<PathBuf>, TargetError> {
        let mut out = Vec::new();
        let mut entries = match tokio::fs::read_dir(dir).await {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io_error("cannot read", dir, e)),
        };
        while let Some(entry) =
            entries.next_entry().await.map_err(|e| io_error("cannot read", dir, e))?
        {
            out.push(entry.path());
        }
        out.sort();
        Ok(out)
    }
}

#[tonic::async_trait]
impl Target for DirectoryTarget {
    async fn apply(&self, owner: &Owner, manifests: &[Value]) -> Result<(), TargetError> {
        let dir = self.dir(&owner.name);
        tokio::fs::create_dir_all(&dir).await.map_err(|e| io_error("cannot create", &dir, e))?;
        let mut wanted = Vec::new();
        for manifest in manifests {
            let path = dir.join(file_name(manifest));
            let yaml = to_yaml(manifest)?;
            let unchanged =
                tokio::fs::read_to_string(&path).await.is_ok_and(|existing| existing == yaml);
            if !unchanged {
                Self::write_atomic(&path, &yaml).await?;
            }
            wanted.push(path);
        }
        for path in Self::files(&dir).await? {
            if !wanted.contains(&path) {
                tokio::fs::remove_file(&path)
                    .await
                    .map_err(|e| io_error("cannot remove", &path, e))?;
            }
        }
        Ok(())
    }

    async fn observe(
        &self,
        owner: &Owner,
        rendered: &Rendered,
    ) -> Result<Observation, TargetError> {
        let dir = self.dir(&owner.name);
        let mut drifted = Self::files(&dir).await?.len() != rendered.manifests.len();
        for manifest in &rendered.manifests {
            let path = dir.join(file_name(manifest));
            let current = tokio::fs::read_to_string(&path).await.ok();
            drifted |= current.as_deref() != Some(to_yaml(manifest)?.as_str());
        }
        let route_address = rendered
            .manifests
            .iter()
            .find(|m| m["kind"] == "Ingress")
            .and_then(|i| i["spec"]["rules"][0]["host"].as_str())
            .unwrap_or("")
            .to_string();
        Ok(Observation { workload: Workload::Written, route_address, drifted })
    }

    async fn delete(&self, owner: &Owner) -> Result<bool, TargetError> {
        let dir = self.dir(&owner.name);
        match tokio::fs::remove_dir_all(&dir).await {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
            Err(e) => Err(io_error("cannot remove", &dir, e)),
        }
    }

    fn name(&self) -> &'static str {
        "directory"
    }
}
