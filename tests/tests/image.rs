//! The image built here with no base image and no registry
//! (`deploy/image/build.sh`): reproducible, readable by skopeo, and its
//! root filesystem runs gantry as user 65532 with only what it carries.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gantry_testkit::{
    binary, free_port, in_ci, skipped, temp_dir, wait_ready, without_test_cargo_env, workspace_root,
};
use serde_json::Value;

/// `build.sh OUT` on the binaries the tests built; its last line.
fn build(out: &Path) -> String {
    let binaries = binary("gateway-store").parent().unwrap().to_path_buf();
    let mut command = Command::new("bash");
    command
        .arg(workspace_root().join("deploy/image/build.sh"))
        .arg(out)
        .env("GANTRY_IMAGE_BINARIES", &binaries)
        .env("SOURCE_DATE_EPOCH", "1764900000");
    without_test_cargo_env(&mut command);
    let done = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&done.stdout).into_owned();
    assert!(done.status.success(), "build.sh: {stdout}{}", String::from_utf8_lossy(&done.stderr));
    stdout.lines().last().unwrap().to_string()
}

/// The files of a tar archive: path -> bytes (directories as empty).
fn untar(archive: &Path, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let status = Command::new("tar").arg("xf").arg(archive).arg("-C").arg(dir).status().unwrap();
    assert!(status.success());
    dir.to_path_buf()
}

fn blob(layout: &Path, digest: &str) -> Vec<u8> {
    std::fs::read(layout.join("blobs/sha256").join(digest.trim_start_matches("sha256:"))).unwrap()
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

#[test]
fn the_image_is_reproducible_readable_and_runs_as_nonroot() {
    let dir = temp_dir("image");
    let (first, second) = (dir.join("first.tar"), dir.join("second.tar"));
    let reference = build(&first);
    assert_eq!(build(&second), reference, "the same inputs give the same digest");
    assert_eq!(
        std::fs::read(&first).unwrap(),
        std::fs::read(&second).unwrap(),
        "and the same bytes"
    );
    let (name, digest) = reference.split_once('@').unwrap();
    assert_eq!(name, "ghcr.io/gantry-dev/gantry");

    // The layout: index -> manifest (whose digest is the one printed) ->
    // config (user 65532) and one layer.
    let layout = untar(&first, &dir.join("layout"));
    let index = json(&std::fs::read(layout.join("index.json")).unwrap());
    let described = &index["manifests"][0];
    assert_eq!(described["digest"], digest);
    assert_eq!(
        described["annotations"]["io.containerd.image.name"],
        "ghcr.io/gantry-dev/gantry:0.1.0"
    );
    let manifest_bytes = blob(&layout, digest);
    let actual = format!("sha256:{:x}", <sha2::Sha256 as sha2::Digest>::digest(&manifest_bytes));
    assert_eq!(actual, digest, "the printed digest is the manifest's");
    let manifest = json(&manifest_bytes);
    let config = json(&blob(&layout, manifest["config"]["digest"].as_str().unwrap()));
    assert_eq!(config["config"]["User"], "65532:65532");
    assert_eq!(config["created"], "2025-12-05T02:00:00Z");
    let layer = layout.join("layer.tar.gz");
    std::fs::write(&layer, blob(&layout, manifest["layers"][0]["digest"].as_str().unwrap()))
        .unwrap();
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let status = Command::new("tar").arg("xzf").arg(&layer).arg("-C").arg(&root).status().unwrap();
    assert!(status.success());
    for file in [
        "usr/local/bin/gateway-store",
        "usr/local/bin/gateway-reconciler",
        "usr/local/bin/gatewayctl",
        "etc/ssl/certs/ca-certificates.crt",
    ] {
        assert!(root.join(file).is_file(), "{file} missing");
    }
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(passwd.contains(":65532:65532:"), "{passwd}");

    match Command::new("skopeo").arg("--version").output() {
        Ok(_) => {
            let out = Command::new("skopeo")
                .arg("inspect")
                .arg(format!("oci-archive:{}", first.display()))
                .output()
                .unwrap();
            assert!(out.status.success(), "skopeo: {}", String::from_utf8_lossy(&out.stderr));
            assert_eq!(json(&out.stdout)["Digest"], digest);
        }
        Err(_) => {
            assert!(
                !in_ci(),
                "CI=true but skopeo is missing: tests/k8s/setup.sh image installs it"
            );
            skipped(
                "skopeo not installed (tests/k8s/setup.sh image): the archive was not read by it",
            );
        }
    }

    // Only what the image carries: gantry in a chroot of its root
    // filesystem, as 65532, serving until asked to stop.
    if !is_root() {
        assert!(!in_ci(), "CI=true but not root: the image's root filesystem was not run");
        skipped("not root: the image's root filesystem was not run in a chroot");
        return;
    }
    let in_image = |args: &[&str]| {
        // Found on this machine's PATH; the command inside the chroot sees
        // only the image's.
        let chroot = which("chroot");
        let mut command = Command::new(chroot);
        command
            .arg("--userspec=65532:65532")
            .arg(&root)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin");
        command
    };
    let version = in_image(&["gatewayctl", "version", "--client"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&version.stdout), "Client Version: 0.1.0\n");
    assert!(in_image(&["gateway-reconciler", "--help"]).output().unwrap().status.success());
    let (grpc, http) = (free_port(), free_port());
    let mut store = in_image(&[
        "gateway-store",
        &format!("--listen=127.0.0.1:{grpc}"),
        &format!("--http-listen=127.0.0.1:{http}"),
        "--data-dir=/tmp/data",
        "--allow-unauthenticated",
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    wait_ready(http, "/readyz", Duration::from_secs(30));
    let _ = store.kill();
    let _ = store.wait();
    let _ = std::fs::remove_dir_all(dir);
}

fn which(program: &str) -> PathBuf {
    let out = Command::new("sh").arg("-c").arg(format!("command -v {program}")).output().unwrap();
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// The test gateway's entrypoint run in a chroot of its root filesystem
/// as 65532, serving on `ports`.
fn run_test_gateway(dir: &Path, never_ready: bool, ports: &[u16]) -> std::process::Child {
    let out = dir.join("gateway.tar");
    let mut build = Command::new(binary("gantry-image"));
    build.args([
        "--out",
        out.to_str().unwrap(),
        "--name",
        "gantry.test/gateway",
        "--tag",
        "1",
        "test-gateway",
    ]);
    if never_ready {
        build.arg("--never-ready");
    }
    assert!(build.output().unwrap().status.success());
    let layout = untar(&out, &dir.join("layout"));
    let docker = json(&std::fs::read(layout.join("manifest.json")).unwrap());
    let config = json(&std::fs::read(layout.join(docker[0]["Config"].as_str().unwrap())).unwrap());
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let layer = layout.join(docker[0]["Layers"][0].as_str().unwrap());
    assert!(Command::new("tar")
        .arg("xzf")
        .arg(layer)
        .arg("-C")
        .arg(&root)
        .status()
        .unwrap()
        .success());
    let entrypoint: Vec<String> =
        serde_json::from_value(config["config"]["Entrypoint"].clone()).unwrap();
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    Command::new(which("chroot"))
        .arg("--userspec=65532:65532")
        .arg(&root)
        .args(&entrypoint)
        .env_clear()
        .env("PORTS", ports.join(" "))
        .spawn()
        .unwrap()
}

fn status_of(port: u16, path: &str) -> Option<String> {
    let answer = gantry_testkit::http_get(port, path)?;
    answer.lines().next().map(str::to_string)
}

#[test]
fn the_test_gateway_serves_its_page_probes_and_stops_on_sigterm() {
    if !is_root() {
        assert!(!in_ci(), "CI=true but not root: the test gateway was not run");
        skipped("not root: the test gateway's root filesystem was not run in a chroot");
        return;
    }
    for never_ready in [false, true] {
        let dir = temp_dir(if never_ready { "never-ready-image" } else { "gateway-image" });
        let (web, health) = (free_port(), free_port());
        let mut gateway = run_test_gateway(&dir, never_ready, &[web, health]);
        let page = gantry_testkit::wait_for_http(web, "/", Duration::from_secs(10));
        assert!(page.starts_with("HTTP/1.0 200") || page.starts_with("HTTP/1.1 200"), "{page}");
        assert!(page.contains("gantry test gateway"), "{page}");
        let ready = gantry_testkit::wait_for_http(health, "/readyz", Duration::from_secs(10));
        assert_eq!(ready.contains(" 200 "), !never_ready, "never_ready={never_ready}: {ready}");
        assert!(status_of(health, "/healthz").unwrap().contains(" 200 "));
        // SIGTERM: PID 1 (the shell) exits 0 within a couple of seconds.
        assert!(Command::new("kill")
            .arg("-TERM")
            .arg(gateway.id().to_string())
            .status()
            .unwrap()
            .success());
        let mut status = None;
        gantry_testkit::eventually_blocking(Duration::from_secs(10), "it exits on SIGTERM", || {
            status = gateway.try_wait().unwrap();
            status.is_some()
        });
        assert_eq!(status.unwrap().code(), Some(0), "never_ready={never_ready}");
        // The daemonised servers stay with the container's PID namespace on
        // a node; here they are stopped by hand.
        let _ = Command::new("pkill").args(["-u", "65532", "-f", "/bin/busybox httpd"]).status();
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// deploy/Dockerfile, the way for users with a registry, builds on bases
/// pinned by digest: every `FROM` names an earlier stage or an image with
/// `@sha256:` and 64 hex digits.
#[test]
fn the_dockerfile_pins_its_base_images_by_digest() {
    let dockerfile = std::fs::read_to_string(workspace_root().join("deploy/Dockerfile")).unwrap();
    let mut stages = Vec::new();
    let mut bases = 0;
    for line in dockerfile.lines().filter(|l| l.trim_start().starts_with("FROM ")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let image = words[1];
        if !stages.contains(&image) {
            let digest = image.split_once("@sha256:").map(|(_, d)| d).unwrap_or_default();
            assert!(
                digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
                "not pinned by digest: {line}"
            );
            bases += 1;
        }
        if let [.., as_word, stage] = words[..] {
            if as_word.eq_ignore_ascii_case("AS") {
                stages.push(stage);
            }
        }
    }
    assert_eq!(bases, 2, "the builder and the runtime base:\n{dockerfile}");
}
