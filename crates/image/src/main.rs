//! `gantry-image`: container images as OCI archives, with no base image
//! and no registry. `gantry` (deploy/image/build.sh runs it): the three
//! binaries in /usr/local/bin, the shared libraries `ldd` says they load,
//! CA certificates, `/etc/passwd` naming user 65532, which the image runs
//! as (distroless-like). Written as an OCI archive; prints
//! `NAME@sha256:DIGEST` as its last line. Reproducible: every time in it is
//! `--epoch`, entries are in path order, JSON and gzip are canonical, and
//! binaries lose their debug sections (`strip --strip-debug`, when there).
//! `test-gateway`: busybox serving the pages a gateway's probes ask for,
//! for tests on a real node.

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
#[command(about = "Assemble an OCI image archive: gantry's, or a test gateway's")]
struct Args {
    /// Where to write the OCI archive.
    #[arg(long, global = true, default_value = "image.oci.tar")]
    out: PathBuf,
    /// Repository name.
    #[arg(
        long,
        global = true,
        env = "GANTRY_IMAGE_NAME",
        default_value = "ghcr.io/gantry-dev/gantry"
    )]
    name: String,
    /// Tag (gantry's: its version).
    #[arg(long, global = true, default_value = "latest")]
    tag: String,
    /// Seconds since the epoch for every time in the image (the commit's).
    #[arg(long, global = true, env = "SOURCE_DATE_EPOCH", default_value_t = 0)]
    epoch: u64,
    #[command(subcommand)]
    kind: Kind,
}

#[derive(clap::Subcommand, Debug)]
enum Kind {
    /// gateway-store, gateway-reconciler and gatewayctl (deploy/image/build.sh).
    Gantry {
        /// Directory holding gateway-store, gateway-reconciler and gatewayctl.
        #[arg(long, env = "GANTRY_IMAGE_BINARIES")]
        binaries: PathBuf,
        /// The source revision, as a label.
        #[arg(long, default_value = "unknown")]
        revision: String,
        /// PEM bundle of CA certificates to carry.
        #[arg(long, default_value = "/etc/ssl/certs/ca-certificates.crt")]
        ca_bundle: PathBuf,
    },
    /// A gateway for tests on a real node: busybox's httpd serving a page
    /// on the gateway port (8443) and ok on the health ports (8081, 8082)
    /// the rendered probes ask; with --never-ready, /readyz answers 404, so
    /// the pods never become Ready.
    TestGateway {
        /// A static busybox (Debian: busybox-static).
        #[arg(long, default_value = "/bin/busybox")]
        busybox: PathBuf,
        /// Answer /readyz with 404.
        #[arg(long)]
        never_ready: bool,
    },
    /// One static binary as /usr/local/bin/NAME, its entrypoint, run as
    /// 65532 (the real node's CoreDNS).
    Static {
        /// The binary (statically linked).
        binary: PathBuf,
    },
    /// The pod sandbox image (containerd's `sandbox_image`) for a node with
    /// no registry: a shell that waits until SIGTERM and exits 0.
    Pause {
        /// A static busybox (Debian: busybox-static).
        #[arg(long, default_value = "/bin/busybox")]
        busybox: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (root, mut image) = match &args.kind {
        Kind::Gantry { binaries, revision, ca_bundle } => {
            (gantry_root(binaries, ca_bundle)?, gantry_image(revision, &args.tag))
        }
        Kind::TestGateway { busybox, never_ready } => test_gateway(busybox, *never_ready)?,
        Kind::Pause { busybox } => pause(busybox)?,
        Kind::Static { binary } => static_binary(binary)?,
    };
    (image.name, image.tag, image.epoch) = (args.name.clone(), args.tag.clone(), args.epoch);
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

/// gantry's image settings (name, tag and time are set by `main`).
fn gantry_image(revision: &str, version: &str) -> oci::Image {
    oci::Image {
        name: String::new(),
        tag: String::new(),
        epoch: 0,
        user: format!("{NONROOT}:{NONROOT}"),
        entrypoint: vec!["/usr/local/bin/gateway-store".into()],
        env: vec![
            "PATH=/usr/local/bin:/usr/bin:/bin".into(),
            "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt".into(),
        ],
        ports: vec![50051, 9090, 9091],
        labels: vec![
            ("org.opencontainers.image.revision".into(), revision.into()),
            (
                "org.opencontainers.image.source".into(),
                "https://github.com/gantry-dev/gantry".into(),
            ),
            ("org.opencontainers.image.version".into(), version.into()),
        ],
    }
}

/// The test gateway: busybox, its pages, and a shell as PID 1 that serves
/// until SIGTERM and then exits 0.
fn test_gateway(busybox: &Path, never_ready: bool) -> anyhow::Result<(tar::Tree, oci::Image)> {
    let mut root = tar::Tree::default();
    let bytes = std::fs::read(busybox)
        .with_context(|| format!("reading {} (Debian: busybox-static)", busybox.display()))?;
    root.file("bin/busybox", 0o755, 0, bytes);
    root.file("www/index.html", 0o644, 0, b"gantry test gateway\n".to_vec());
    // Never ready: /readyz answers 404, /healthz still 200 (no restarts).
    let pages: &[&str] = if never_ready { &["healthz"] } else { &["readyz", "healthz"] };
    for page in pages {
        root.file(&format!("www/{page}"), 0o644, 0, b"ok\n".to_vec());
    }
    users(&mut root);
    // The ports come from $PORTS when set (tests on a shared host).
    let ports = "${PORTS:-8443 8081 8082}";
    // httpd daemonises; the shell stays as PID 1 and exits 0 on SIGTERM
    // (after at most the second it sleeps).
    let script = format!(
        "trap 'exit 0' TERM; for p in {ports}; do /bin/busybox httpd -p $p -h /www; done; \
         while :; do /bin/busybox sleep 1; done"
    );
    let image = oci::Image {
        name: String::new(),
        tag: String::new(),
        epoch: 0,
        user: format!("{NONROOT}:{NONROOT}"),
        entrypoint: vec!["/bin/busybox".into(), "sh".into(), "-c".into(), script, "gateway".into()],
        env: vec!["PATH=/bin".into()],
        ports: vec![8443, 8081, 8082],
        labels: vec![],
    };
    Ok((root, image))
}

/// A static binary and the users; it is the entrypoint.
fn static_binary(binary: &Path) -> anyhow::Result<(tar::Tree, oci::Image)> {
    let name = binary.file_name().and_then(|n| n.to_str()).context("a binary's file name")?;
    let mut root = tar::Tree::default();
    let path = format!("usr/local/bin/{name}");
    root.file(
        &path,
        0o755,
        0,
        std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?,
    );
    users(&mut root);
    let image = oci::Image {
        name: String::new(),
        tag: String::new(),
        epoch: 0,
        user: format!("{NONROOT}:{NONROOT}"),
        entrypoint: vec![format!("/{path}")],
        env: vec!["PATH=/usr/local/bin".into()],
        ports: vec![],
        labels: vec![],
    };
    Ok((root, image))
}

/// The sandbox: busybox and a shell that sleeps until SIGTERM.
fn pause(busybox: &Path) -> anyhow::Result<(tar::Tree, oci::Image)> {
    let mut root = tar::Tree::default();
    let bytes = std::fs::read(busybox)
        .with_context(|| format!("reading {} (Debian: busybox-static)", busybox.display()))?;
    root.file("bin/busybox", 0o755, 0, bytes);
    let script = "trap 'exit 0' TERM INT; while :; do /bin/busybox sleep 1; done";
    let image = oci::Image {
        name: String::new(),
        tag: String::new(),
        epoch: 0,
        user: format!("{NONROOT}:{NONROOT}"),
        entrypoint: vec![
            "/bin/busybox".into(),
            "sh".into(),
            "-c".into(),
            script.into(),
            "pause".into(),
        ],
        env: vec!["PATH=/bin".into()],
        ports: vec![],
        labels: vec![],
    };
    Ok((root, image))
}

/// `/etc/passwd` and `/etc/group` naming root and 65532 (`nonroot`), its
/// home and `/tmp`.
fn users(root: &mut tar::Tree) {
    let passwd = format!(
        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{NONROOT}:{NONROOT}:nonroot:/home/nonroot:/sbin/nologin\n"
    );
    root.file("etc/passwd", 0o644, 0, passwd.into_bytes());
    root.file("etc/group", 0o644, 0, format!("root:x:0:\nnonroot:x:{NONROOT}:\n").into_bytes());
    root.dir("tmp", 0o1777, 0);
    root.dir("home/nonroot", 0o755, NONROOT);
}

/// gantry's files.
fn gantry_root(binaries: &Path, ca_bundle: &Path) -> anyhow::Result<tar::Tree> {
    let mut root = tar::Tree::default();
    let mut libraries = std::collections::BTreeSet::new();
    for name in BINARIES {
        let path = binaries.join(name);
        if !path.is_file() {
            bail!(
                "{} is missing: build it first (cargo build --release -p gantry-store -p gantry-reconciler -p gantry-ctl)",
                path.display()
            );
        }
        root.file(&format!("usr/local/bin/{name}"), 0o755, 0, stripped(&path)?);
        libraries.extend(loaded_libraries(&path)?);
    }
    for library in libraries {
        let bytes =
            std::fs::read(format!("/{library}")).with_context(|| format!("reading /{library}"))?;
        root.file(&library, 0o755, 0, bytes);
    }
    let ca = std::fs::read(ca_bundle).with_context(|| {
        format!("reading CA certificates {} (Debian: ca-certificates)", ca_bundle.display())
    })?;
    root.file("etc/ssl/certs/ca-certificates.crt", 0o644, 0, ca);
    root.file("etc/nsswitch.conf", 0o644, 0, b"hosts: files dns\n".to_vec());
    users(&mut root);
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
