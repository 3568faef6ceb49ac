//! deploy/monitoring: the alerting rules pass `promtool check rules` and
//! their unit tests (`promtool test rules`), and every metric the rules
//! and the Grafana dashboard name is one the store and the reconciler
//! export (scraped from real processes that did some work).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use gantry_testkit::{http_get, in_ci, skipped, temp_dir, ReconcilerProcess, StoreProcess};

fn monitoring() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring")
}

#[test]
fn the_alerting_rules_pass_promtool_and_their_unit_tests() {
    if Command::new("promtool").arg("--version").output().is_err() {
        assert!(!in_ci(), "promtool is not installed: tests/k8s/setup.sh promtool installs it");
        skipped("promtool is not installed (tests/k8s/setup.sh promtool): alert rules not checked");
        return;
    }
    // Every alert links its runbook as Prometheus' tooling expects it.
    let rules = std::fs::read_to_string(monitoring().join("alerts.yaml")).unwrap();
    let alerts = rules.matches("- alert:").count();
    assert_eq!(
        rules.matches("runbook_url: docs/operations.md#").count(),
        alerts,
        "runbook_url on every alert"
    );
    let runbook = std::fs::read_to_string(monitoring().join("../../docs/operations.md")).unwrap();
    for alert in rules.lines().filter_map(|l| l.trim().strip_prefix("- alert: ")) {
        assert!(
            runbook.contains(&format!("### {alert}\n")),
            "docs/operations.md has no section for {alert}"
        );
    }
    for args in [["check", "rules", "alerts.yaml"], ["test", "rules", "alerts_test.yaml"]] {
        let out = Command::new("promtool").args(args).current_dir(monitoring()).output().unwrap();
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Metric names a PromQL text names (gantry's only).
fn named(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("gantry_") {
        let tail = &rest[at..];
        let end =
            tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        let name = &tail[..end];
        // Not a label value or a name inside another word.
        let before = rest[..at].chars().last();
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '"' || c == '/') {
            names.insert(name.to_string());
        }
        rest = &tail[end..];
    }
    names
}

/// The sample names of an exposition (`name{...} value`).
fn exported(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_string())
        .collect()
}

/// The largest finite `le` of a histogram family's buckets.
fn largest_bucket(exposition: &str, family: &str) -> f64 {
    exposition
        .lines()
        .filter(|l| l.starts_with(&format!("{family}_bucket{{")))
        .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next()?.parse::<f64>().ok())
        .filter(|le| le.is_finite())
        .fold(0.0, f64::max)
}

fn scrape(port: u16) -> String {
    let answer = http_get(port, "/metrics").unwrap();
    answer.split("\r\n\r\n").nth(1).unwrap().to_string()
}

/// `GET /metrics` with `Accept: accept`; (head, body).
fn scrape_accepting(port: u16, accept: &str) -> (String, String) {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    (head.to_lowercase(), body.to_string())
}

/// The exposition formats: the classic text by default, clean under
/// `promtool check metrics` (its lint too); OpenMetrics when asked for.
fn check_formats(service: &str, port: u16, classic: &str) {
    for family in ["process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"]
    {
        assert!(
            classic.lines().any(|l| l.starts_with(&format!("{family} "))),
            "{service}: {family}"
        );
    }
    let build = format!("gantry_build_info{{service=\"{service}\",version=\"");
    assert!(classic.contains(&build), "{service}: no {build}");
    assert!(!classic.contains("# EOF"), "{service}: OpenMetrics served unasked");
    let (head, open) =
        scrape_accepting(port, "application/openmetrics-text;version=1.0.0,text/plain;q=0.5");
    assert!(head.contains("content-type: application/openmetrics-text"), "{head}");
    assert!(open.trim_end().ends_with("# EOF"), "{service}");
    let (head, _) = scrape_accepting(port, "text/plain");
    assert!(head.contains("content-type: text/plain; version=0.0.4"), "{head}");
    if Command::new("promtool").arg("--version").output().is_err() {
        assert!(!in_ci(), "promtool is not installed: tests/k8s/setup.sh promtool installs it");
        skipped("promtool is not installed (tests/k8s/setup.sh promtool): exposition not linted");
        return;
    }
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        check.stdin.take().unwrap().write_all(classic.as_bytes()).unwrap();
    }
    let out = check.wait_with_output().unwrap();
    let said =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics on {service}: {said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_the_rules_name_is_exported() {
    let dir = temp_dir("monitoring");
    let database = format!("sqlite://{}", dir.join("gantry.db").display());
    let store = StoreProcess::start(&database, &dir);
    let directory = dir.join("manifests");
    let reconciler = ReconcilerProcess::start(
        &store.endpoint(),
        &["--target", "directory", "--directory", directory.to_str().unwrap()],
    );
    // Some work, so that every family has its series.
    let client = store.client();
    let gateway = gantry_api::v1::Gateway {
        metadata: Some(gantry_api::v1::ObjectMeta { name: "edge".into(), ..Default::default() }),
        spec: Some(gantry_api::v1::GatewaySpec {
            image: "ghcr.io/acme/gw:1".into(),
            ..Default::default()
        }),
        status: None,
    };
    client
        .clone()
        .create_gateway(gantry_api::v1::CreateGatewayRequest {
            gateway: Some(gateway),
            validate_only: false,
        })
        .await
        .unwrap();
    reconciler.wait_observed(&client, "edge", 1).await;

    let (store_text, reconciler_text) = (scrape(store.http), scrape(reconciler.http));
    check_formats("gateway-store", store.http, &store_text);
    check_formats("gateway-reconciler", reconciler.http, &reconciler_text);
    // A call that runs into its timeout still lands in a finite bucket.
    for (family, text, timeout) in [
        ("gantry_store_grpc_request_duration_seconds", &store_text, 30.0),
        ("gantry_reconciler_reconcile_duration_seconds", &reconciler_text, 300.0),
        ("gantry_reconciler_stage_duration_seconds", &reconciler_text, 15.0),
    ] {
        let top = largest_bucket(text, family);
        assert!(top >= timeout, "{family} ends at {top} s, under its timeout of {timeout} s");
    }
    let mut available = exported(&store_text);
    available.extend(exported(&reconciler_text));
    let rules = std::fs::read_to_string(monitoring().join("alerts.yaml")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(monitoring().join("dashboard.json")).unwrap(),
    )
    .unwrap();
    let queries: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    assert!(queries.len() >= 10, "the dashboard has its queries");
    // The rules' expressions, not their prose.
    let expressions: Vec<&str> =
        rules.lines().filter(|l| l.trim_start().starts_with("expr:")).collect();
    assert_eq!(expressions.len(), 9, "every alert's expression");
    let mut wanted = named(&expressions.join("\n"));
    for query in &queries {
        wanted.extend(named(query));
    }
    assert!(wanted.len() >= 10, "{wanted:?}");
    let missing: Vec<&String> = wanted.iter().filter(|n| !available.contains(*n)).collect();
    assert!(missing.is_empty(), "named but not exported: {missing:?}\nexported: {available:?}");
    drop(reconciler);
    let _ = std::fs::remove_dir_all(dir);
}
