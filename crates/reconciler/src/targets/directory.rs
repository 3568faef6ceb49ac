//! The directory target: each gateway's manifests as YAML files under
//! `<dir>/<gateway>/`, each written to a temporary file and renamed into
//! place, so a reader never sees half a file.
//!
//! It touches only what it wrote: a gateway's directory carries a marker
//! file with the gateway's uid, a directory without it (or with another
//! uid) is refused, only `<kind>.yaml` files of the kinds gantry renders
//! are replaced or removed, the directory itself is removed only once
//! empty, and a symbolic link is never followed (a link in place of the
//! directory or of a file is refused).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{Owner, Target, TargetError};
use crate::render::{Rendered, OWNED_KINDS};

/// The marker file in each gateway's directory; it holds the gateway's uid.
pub const MARKER: &str = ".gantry-gateway";
use crate::status::{Observation, Workload};

/// Manifests in a directory.
#[derive(Debug, Clone)]
pub struct DirectoryTarget {
    root: PathBuf,
}

fn io_error(context: &str, path: &Path, e: std::io::Error) -> TargetError {
    TargetError::Other(format!("{context} {}: {e}", path.display()))
}

/// The YAML of one manifest.
pub fn to_yaml(manifest: &Value) -> Result<String, TargetError> {
    serde_saphyr::to_string(manifest)
        .map_err(|e| TargetError::Other(format!("cannot render YAML: {e}")))
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

    /// The `<kind>.yaml` files of rendered kinds present in `dir`.
    async fn files(dir: &Path) -> Result<Vec<PathBuf>, TargetError> {
        let mut out = Vec::new();
        for (_, kind) in OWNED_KINDS {
            let path = dir.join(format!("{}.yaml", kind.to_ascii_lowercase()));
            if Self::kind_of(&path).await?.is_some() {
                out.push(path);
            }
        }
        Ok(out)
    }

    /// What is at `path` without following a link: `None` when nothing;
    /// a link is refused.
    async fn kind_of(path: &Path) -> Result<Option<std::fs::FileType>, TargetError> {
        match tokio::fs::symlink_metadata(path).await {
            Ok(m) if m.file_type().is_symlink() => Err(TargetError::Other(format!(
                "{} is a symbolic link; gantry does not follow links out of its directory",
                path.display()
            ))),
            Ok(m) => Ok(Some(m.file_type())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error("cannot inspect", path, e)),
        }
    }

    /// Fails unless `dir` is absent, or a directory marked with `owner`'s
    /// uid (or an empty one, which is then marked).
    async fn claim(dir: &Path, owner: &Owner) -> Result<(), TargetError> {
        let marker = dir.join(MARKER);
        match Self::kind_of(dir).await? {
            None => {
                tokio::fs::create_dir_all(dir)
                    .await
                    .map_err(|e| io_error("cannot create", dir, e))?;
            }
            Some(t) if !t.is_dir() => {
                return Err(TargetError::Other(format!(
                    "{} exists and is not a directory",
                    dir.display()
                )));
            }
            Some(_) => {
                if Self::kind_of(&marker).await?.is_some() {
                    let uid = tokio::fs::read_to_string(&marker)
                        .await
                        .map_err(|e| io_error("cannot read", &marker, e))?;
                    if uid.trim() == owner.uid {
                        return Ok(());
                    }
                    return Err(TargetError::Other(format!(
                        "{} belongs to another gateway named {} (uid {}); remove it if that gateway is gone",
                        dir.display(),
                        owner.name,
                        uid.trim()
                    )));
                }
                let mut entries =
                    tokio::fs::read_dir(dir).await.map_err(|e| io_error("cannot read", dir, e))?;
                if entries
                    .next_entry()
                    .await
                    .map_err(|e| io_error("cannot read", dir, e))?
                    .is_some()
                {
                    return Err(TargetError::Other(format!(
                        "{} exists and was not written by gantry; move it away",
                        dir.display()
                    )));
                }
            }
        }
        Self::write_atomic(&marker, &format!("{}\n", owner.uid)).await
    }
}

#[tonic::async_trait]
impl Target for DirectoryTarget {
    async fn apply(&self, owner: &Owner, rendered: &Rendered) -> Result<(), TargetError> {
        let dir = self.dir(&owner.name);
        Self::claim(&dir, owner).await?;
        let mut wanted = Vec::new();
        for manifest in &rendered.objects {
            let path = dir.join(manifest.file_name());
            Self::kind_of(&path).await?;
            let yaml = to_yaml(&manifest.body)?;
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
        let marker = tokio::fs::read_to_string(dir.join(MARKER)).await.unwrap_or_default();
        let mut drift = (marker.trim() != owner.uid).then(|| format!("{MARKER} of {}", owner.name));
        if Self::files(&dir).await?.len() != rendered.objects.len() {
            drift.get_or_insert_with(|| format!("the files of {}", owner.name));
        }
        for manifest in &rendered.objects {
            let path = dir.join(manifest.file_name());
            let current = tokio::fs::read_to_string(&path).await.ok();
            if current.as_deref() != Some(to_yaml(&manifest.body)?.as_str()) {
                drift.get_or_insert_with(|| {
                    format!("{} differs from the rendering", path.display())
                });
            }
        }
        // Nothing admits a route here: no address is claimed.
        Ok(Observation { workload: Workload::Written, route_address: String::new(), drift })
    }

    async fn delete(&self, owner: &Owner) -> Result<bool, TargetError> {
        let dir = self.dir(&owner.name);
        let marker = dir.join(MARKER);
        match tokio::fs::read_to_string(&marker).await {
            Ok(uid) if uid.trim() == owner.uid => {}
            // Nothing of this gateway's here (never written, or another's).
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
            Err(e) => return Err(io_error("cannot read", &marker, e)),
        }
        for path in Self::files(&dir).await?.into_iter().chain([marker]) {
            tokio::fs::remove_file(&path).await.map_err(|e| io_error("cannot remove", &path, e))?;
        }
        // Only once empty: anything else in it is not ours.
        match tokio::fs::remove_dir(&dir).await {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
            Err(_) => {
                tracing::warn!(dir = %dir.display(), "left in place: it holds files gantry did not write");
                Ok(true)
            }
        }
    }

    fn name(&self) -> &'static str {
        "directory"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::Manifest;
    use crate::render::{render, RenderSettings};
    use gantry_api::v1::{Gateway, GatewaySpec, ObjectMeta};

    fn owner(uid: &str) -> Owner {
        Owner { name: "edge".into(), uid: uid.into(), recreate: false }
    }

    fn manifests(uid: &str) -> Vec<Manifest> {
        let g = Gateway {
            metadata: Some(ObjectMeta {
                name: "edge".into(),
                uid: uid.into(),
                ..Default::default()
            }),
            spec: Some(GatewaySpec { image: "gw:1".into(), ..Default::default() }),
            status: None,
        };
        render(&g, &RenderSettings::default()).objects
    }

    fn rendered(manifests: &[Manifest]) -> Rendered {
        Rendered { objects: manifests.to_vec(), fingerprint: String::new() }
    }

    fn temp(label: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "gantry-dir-target-{label}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[tokio::test]
    async fn it_touches_only_what_it_wrote() {
        let root = temp("own");
        let target = DirectoryTarget::new(&root);
        target.apply(&owner("u1"), &rendered(&manifests("u1"))).await.unwrap();
        let dir = root.join("edge");
        assert_eq!(std::fs::read_to_string(dir.join(MARKER)).unwrap().trim(), "u1");
        // Someone else's file in the gateway's directory survives prune and delete.
        std::fs::write(dir.join("notes.txt"), "mine").unwrap();
        target.apply(&owner("u1"), &rendered(&manifests("u1")[..2])).await.unwrap();
        assert!(dir.join("notes.txt").exists());
        assert!(!dir.join("deployment.yaml").exists(), "pruned");
        assert!(target.delete(&owner("u1")).await.unwrap());
        assert_eq!(std::fs::read_to_string(dir.join("notes.txt")).unwrap(), "mine");
        assert!(!dir.join("configmap.yaml").exists() && !dir.join(MARKER).exists());
        // Another gateway of the same name (another uid) is refused, and its
        // deletion removes nothing.
        std::fs::remove_file(dir.join("notes.txt")).unwrap();
        target.apply(&owner("u1"), &rendered(&manifests("u1"))).await.unwrap();
        let refused = target.apply(&owner("u2"), &rendered(&manifests("u2"))).await.unwrap_err();
        assert!(refused.to_string().contains("another gateway"), "{refused}");
        assert!(target.delete(&owner("u2")).await.unwrap());
        assert!(dir.join("deployment.yaml").exists());
        std::fs::remove_dir_all(root).unwrap();
    }

    #[tokio::test]
    async fn a_directory_it_did_not_write_or_a_link_is_refused() {
        let root = temp("foreign");
        let target = DirectoryTarget::new(&root);
        let dir = root.join("edge");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("service.yaml"), "someone else's").unwrap();
        let refused = target.apply(&owner("u1"), &rendered(&manifests("u1"))).await.unwrap_err();
        assert!(refused.to_string().contains("not written by gantry"), "{refused}");
        assert_eq!(std::fs::read_to_string(dir.join("service.yaml")).unwrap(), "someone else's");
        std::fs::remove_dir_all(&dir).unwrap();

        // A link in place of a file, pointing out of the root.
        let outside = temp("outside").join("secret.txt");
        std::fs::write(&outside, "keep").unwrap();
        target.apply(&owner("u1"), &rendered(&manifests("u1"))).await.unwrap();
        std::fs::remove_file(dir.join("deployment.yaml")).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("deployment.yaml")).unwrap();
        let refused = target.apply(&owner("u1"), &rendered(&manifests("u1"))).await.unwrap_err();
        assert!(refused.to_string().contains("symbolic link"), "{refused}");
        assert!(target.delete(&owner("u1")).await.is_err(), "delete does not follow it either");
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");

        // A link in place of the gateway's directory.
        std::fs::remove_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(outside.parent().unwrap(), &dir).unwrap();
        assert!(target.apply(&owner("u1"), &rendered(&manifests("u1"))).await.is_err());
        assert_eq!(std::fs::read_dir(outside.parent().unwrap()).unwrap().count(), 1);
        std::fs::remove_dir_all(outside.parent().unwrap()).unwrap();
        std::fs::remove_file(&dir).unwrap();
        std::fs::remove_dir_all(root).unwrap();
    }
}
