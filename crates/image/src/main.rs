//! `gantry-image`: gantry's container image from built binaries, with no
//! base image and no registry (deploy/image/build.sh runs it): the three
//! binaries in /usr/local/bin, the shared libraries `ldd` says they load,
//! CA certificates, `/etc/passwd` naming user 65532, which the image runs
//! as (distroless-like). Written as an OCI archive; prints
//! `NAME@sha256:DIGEST` as its last line. Reproducible: every time in it is
//! `--epoch`, entries are in path order, JSON and gzip are canonical, and
//! binaries lose their debug sections (`strip --strip-debug`, when there).

#![forbid(unsafe_code)]

mod oci;
mod tar;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _};
use clap::Parser;

/// The binaries the image carries.
const BINARIES: [&str; 3] = ["gateway-store", "gateway-reconciler", "gatewayctl"];
/// The user the image runs as (distroless' `nonroot`).
const NONROOT: u32 = 65532;

#[derive(Parser, Debug)]
#[command(about = "Assemble gantry's OCI image archive from built binaries")]
struct Args {
    /// Directory holding gateway-store, gateway-reconciler and gatewayctl.
    #[arg(long, env = "GANTRY_IMAGE_BINARIES")]
    binaries: PathBuf,
    /// Where to write the OCI archive.
    #[arg(long)]
    out: PathBuf,
    /// Repository name.
    #[arg(long, env = "GANTRY_IMAGE_NAME", default_value = "ghcr.io/gantry-dev/gantry")]
    name: String,
    /// Tag (the version).
    #[arg(long)]
    tag: String,
    /// Seconds since the epoch for every time in the image (the commit's).
    #[arg(long, env = "SOURCE_DATE_EPOCH", default_value_t = 0)]
    epoch: u64,
    /// The source revision, as a label.
    #[arg(long, default_value = "unknown")]
    revision: String,
    /// PEM bundle of CA certificates to carry.
    #[arg(long, default_value = "/etc/ssl/certs/ca-certificates.crt")]
    ca_bundle: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let root = root_filesystem(&args)?;
    let image = oci::Image {
        name: args.name.clone(),
        tag: args.tag.clone(),
        epoch: args.epoch,
        user: format!("{NONROOT}:{NONROOT}"),
        entrypoint: vec!["/usr/local/bin/gateway-store".into()],
        env: vec![
            "PATH=/usr/local/bin:/usr/bin:/bin".into(),
            "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt".into(),
        ],
        ports: vec![50051, 9090, 9091],
        labels: vec![
            ("org.opencontainers.image.revision".into(), args.revision.clone()),
            (
                "org.opencontainers.image.source".into(),
                "https://github.com/gantry-dev/gantry".into(),
            ),
            ("org.opencontainers.image.version".into(), args.tag.clone()),
        ],
    };
    let (digest, archive) = oci::archive(&image, &root)?;
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&args.out, archive)
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!("wrote {} ({}:{})", args.out.display(), args.name, args.tag);
    println!("{}@{digest}", args.name);
    Ok(())
}

/// The image's files.
fn root_filesystem(args: &Args) -> anyhow::Result<tar::Tree> {
    let mut root = tar::Tree::default();
    let mut libraries = std::collections::BTreeSet::new();
    for name in BINARIES {
        let path = args.binaries.join(name);
        if !path.is_file() {
            bail!("{} is missing: build it first (cargo build --release -p gantry-store -p gantry-reconciler -p gantry-ctl)", path.display());
        }
        root.file(&format!("usr/local/bin/{name}"), 0o755, 0, stripped(&path)?);
        libraries.extend(loaded_libraries(&path)?);
    }
    for library in libraries {
        let bytes =
            std::fs::read(format!("/{library}")).with_context(|| format!("reading /{library}"))?;
        root.file(&library, 0o755, 0, bytes);
    }
    let ca = std::fs::read(&args.ca_bundle).with_context(|| {
        format!("reading CA certificates {} (Debian: ca-certificates)", args.ca_bundle.display())
    })?;
    root.file("etc/ssl/certs/ca-certificates.crt", 0o644, 0, ca);
    let passwd = format!(
        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{NONROOT}:{NONROOT}:nonroot:/home/nonroot:/sbin/nologin\n"
    );
    root.file("etc/passwd", 0o644, 0, passwd.into_bytes());
    root.file("etc/group", 0o644, 0, format!("root:x:0:\nnonroot:x:{NONROOT}:\n").into_bytes());
    root.file("etc/nsswitch.conf", 0o644, 0, b"hosts: files dns\n".to_vec());
    root.dir("tmp", 0o1777, 0);
    root.dir("home/nonroot", 0o755, NONROOT);
    root.dir("var/lib/gantry", 0o755, NONROOT);
    Ok(root)
}

/// The binary without its debug sections (as is, without `strip`).
fn stripped(path: &Path) -> anyhow::Result<Vec<u8>> {
    let out = std::env::temp_dir().join(format!(
        "gantry-image-{}-{}",
        std::process::id(),
        path.display().to_string().replace('/', "_")
    ));
    let status = Command::new("strip").arg("--strip-debug").arg("-o").arg(&out).arg(path).status();
    let bytes = match status {
        Ok(s) if s.success() => std::fs::read(&out)?,
        _ => std::fs::read(path)?,
    };
    let _ = std::fs::remove_file(&out);
    Ok(bytes)
}

/// The shared libraries (and the loader) `ldd` says `binary` loads, as
/// absolute paths without the leading `/`.
fn loaded_libraries(binary: &Path) -> anyhow::Result<Vec<String>> {
    let out = Command::new("ldd").arg(binary).output().context("running ldd")?;
    if !out.status.success() {
        // A static binary needs nothing.
        return Ok(Vec::new());
    }
    Ok(parse_ldd(&String::from_utf8_lossy(&out.stdout)))
}

fn parse_ldd(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, after)) => after.trim(),
                None => line,
            };
            let path = path.split(" (").next()?.trim();
            path.starts_with('/').then(|| path.trim_start_matches('/').to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_lines_name_the_files_to_carry() {
        let ldd = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x1)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x2)\n\t/lib64/ld-linux-x86-64.so.2 (0x3)\n";
        assert_eq!(
            parse_ldd(ldd),
            [
                "lib/x86_64-linux-gnu/libgcc_s.so.1",
                "lib/x86_64-linux-gnu/libc.so.6",
                "lib64/ld-linux-x86-64.so.2"
            ]
        );
    }
}
