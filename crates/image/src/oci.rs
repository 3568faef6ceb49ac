//! The OCI image archive: one layer (the root filesystem), its config,
//! the manifest, the index naming it, and Docker's `manifest.json` beside
//! them, so that `ctr images import`, `podman load`, `skopeo` and
//! `docker load` all read it. JSON is written with sorted keys and no
//! spaces, gzip without a time: the same inputs give the same digest.

use std::io::Write as _;

use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

use crate::tar::Tree;

const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// What the image says of itself besides its files.
#[derive(Debug, Clone)]
pub struct Image {
    /// Repository name, e.g. `ghcr.io/gantry-dev/gantry`.
    pub name: String,
    pub tag: String,
    /// Seconds since the epoch of every time in the image.
    pub epoch: u64,
    pub user: String,
    pub entrypoint: Vec<String>,
    pub env: Vec<String>,
    pub ports: Vec<u16>,
    pub labels: Vec<(String, String)>,
}

/// A blob: its digest (`sha256:...`) and bytes.
#[derive(Debug, Clone)]
pub struct Blob {
    pub digest: String,
    pub bytes: Vec<u8>,
}

impl Blob {
    fn of(bytes: Vec<u8>) -> Blob {
        Blob { digest: format!("sha256:{}", hex(&bytes)), bytes }
    }

    fn json(value: &Value) -> Blob {
        // serde_json's maps are ordered by key: the text is canonical.
        Blob::of(value.to_string().into_bytes())
    }

    fn descriptor(&self, media_type: &str) -> Value {
        json!({"mediaType": media_type, "digest": self.digest, "size": self.bytes.len()})
    }

    fn hex(&self) -> &str {
        self.digest.trim_start_matches("sha256:")
    }
}

fn hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// RFC 3339 UTC of `epoch` seconds.
pub fn rfc3339(epoch: u64) -> String {
    let (days, secs) = (epoch / 86_400, epoch % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
}

/// The archive of `image` with `root` as its one layer; the manifest's
/// digest (the image's) and the archive's bytes.
pub fn archive(image: &Image, root: &Tree) -> anyhow::Result<(String, Vec<u8>)> {
    let layer_tar = root.archive(image.epoch)?;
    let diff_id = format!("sha256:{}", hex(&layer_tar));
    let mut gz = flate2::GzBuilder::new().mtime(0).write(Vec::new(), flate2::Compression::best());
    gz.write_all(&layer_tar)?;
    let layer = Blob::of(gz.finish()?);
    let created = rfc3339(image.epoch);
    let ports: serde_json::Map<String, Value> =
        image.ports.iter().map(|p| (format!("{p}/tcp"), json!({}))).collect();
    let labels: serde_json::Map<String, Value> =
        image.labels.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    let config = Blob::json(&json!({
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "User": image.user,
            "Entrypoint": image.entrypoint,
            "Env": image.env,
            "ExposedPorts": ports,
            "Labels": labels,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": "deploy/image/build.sh (gantry-image)"}],
    }));
    let manifest = Blob::json(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": config.descriptor(CONFIG),
        "layers": [layer.descriptor(LAYER)],
    }));
    let reference = format!("{}:{}", image.name, image.tag);
    let mut described = manifest.descriptor(MANIFEST);
    described["annotations"] = json!({
        "io.containerd.image.name": reference,
        "org.opencontainers.image.ref.name": image.tag,
    });
    let index = json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": [described]});
    let docker = json!([{
        "Config": format!("blobs/sha256/{}", config.hex()),
        "RepoTags": [reference],
        "Layers": [format!("blobs/sha256/{}", layer.hex())],
    }]);
    let mut out = Tree::default();
    for blob in [&layer, &config, &manifest] {
        out.file(&format!("blobs/sha256/{}", blob.hex()), 0o644, 0, blob.bytes.clone());
    }
    out.file("index.json", 0o644, 0, index.to_string().into_bytes());
    out.file("oci-layout", 0o644, 0, br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec());
    out.file("manifest.json", 0o644, 0, docker.to_string().into_bytes());
    Ok((manifest.digest, out.archive(image.epoch)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_470_000), "2026-12-05T11:26:40Z");
    }
}
