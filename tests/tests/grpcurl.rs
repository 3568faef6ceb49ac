//! The store through a tool users already hold: every grpcurl command the
//! README shows, run as written against a live store (reflection, the
//! decoded field violation of a refusal, a watch); and a gzip client.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use gantry_api::v1::{GetGatewayRequest, UpdateGatewayRequest};
use gantry_testkit::{temp_dir, workspace_root, StoreProcess};
use tonic::codec::CompressionEncoding;

/// The grpcurl commands of the README, continuation lines joined.
fn readme_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in readme.lines() {
        let line = line.trim();
        if current.is_empty() && !line.starts_with("grpcurl ") {
            continue;
        }
        current.push_str(line.trim_end_matches('\\'));
        if !line.ends_with('\\') {
            commands.push(std::mem::take(&mut current));
        }
    }
    commands
}

#[test]
fn every_grpcurl_example_of_the_readme_works_as_written() {
    let Some(grpcurl) = gantry_testkit::k8s::grpcurl() else { return };
    let dir = temp_dir("grpcurl");
    let store = StoreProcess::start(&format!("sqlite://{}/store.db", dir.display()), &dir);
    let commands = readme_commands();
    let rpcs: Vec<&str> =
        commands.iter().filter_map(|c| c.split("GatewayService/").nth(1)).collect();
    for rpc in ["Create", "Get", "List", "Update", "Watch", "Delete"] {
        assert!(
            rpcs.iter().any(|r| r.starts_with(rpc)),
            "no README example of {rpc}: {commands:?}"
        );
    }
    let address = format!("127.0.0.1:{}", store.grpc);
    let grpcurl_dir = grpcurl.parent().unwrap().display().to_string();
    for command in &commands {
        let line = command.replace("127.0.0.1:50051", &address);
        let out = Command::new("sh")
            .arg("-c")
            .arg(&line)
            .env("PATH", format!("{grpcurl_dir}:{}", std::env::var("PATH").unwrap()))
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        let said = format!("{line}\nstdout: {stdout}\nstderr: {stderr}");
        assert!(!stderr.contains("is not recognized"), "an undecoded detail: {said}");
        if line.contains("\"image\":\"\"") {
            // The refusal: its field violation, decoded.
            assert!(!out.status.success(), "{said}");
            assert!(stderr.contains("InvalidArgument"), "{said}");
            assert!(stderr.contains("type.googleapis.com/google.rpc.BadRequest"), "{said}");
            assert!(stderr.contains("\"field\": \"gateway.spec.image\""), "{said}");
        } else if line.contains("WatchGateways") {
            // Ended by -max-time after the initial event and its bookmark.
            assert!(
                stdout.contains("EVENT_TYPE_ADDED") && stdout.contains("EVENT_TYPE_BOOKMARK"),
                "{said}"
            );
            assert!(stderr.contains("DeadlineExceeded"), "{said}");
        } else {
            assert!(out.status.success(), "{said}");
        }
        if line.contains("UpdateGateway") && out.status.success() {
            assert!(
                stdout.contains("ghcr.io/acme/gateway:1.1") && stdout.contains("payments"),
                "{said}"
            );
        }
        if line.contains(" list ") {
            assert!(stdout.contains("gantry.v1.GatewayService.WatchGateways"), "{said}");
        }
    }
    // The error-detail protos themselves, for any reflection client.
    for message in ["google.rpc.Status", "google.rpc.BadRequest", "google.rpc.ErrorInfo"] {
        let out = Command::new(&grpcurl)
            .args(["-plaintext", &address, "describe", message])
            .output()
            .unwrap();
        let described = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && described.contains("is a message"),
            "{message}: {described}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_compressed_requests_are_read_and_answered_compressed() {
    let dir = temp_dir("gzip");
    let store = StoreProcess::start(&format!("sqlite://{}/store.db", dir.display()), &dir);
    let channel =
        tonic::transport::Endpoint::from_shared(store.endpoint()).unwrap().connect().await.unwrap();
    let mut client = gantry_api::v1::gateway_service_client::GatewayServiceClient::new(channel)
        .send_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Gzip);
    // Several KB of config that compresses well.
    let value = "value ".repeat(20);
    let gateway = (0..200)
        .fold(gantry_testkit::gateway::named("edge").image("ghcr.io/acme/gw:1"), |g, i| {
            g.config(&format!("key{i}"), &value)
        })
        .build();
    let created = client
        .create_gateway(gantry_api::v1::CreateGatewayRequest {
            gateway: Some(gateway.clone()),
            validate_only: false,
        })
        .await
        .unwrap();
    assert_eq!(created.metadata().get("grpc-encoding").and_then(|v| v.to_str().ok()), Some("gzip"));
    let read = client.get_gateway(GetGatewayRequest { name: "edge".into() }).await.unwrap();
    assert_eq!(read.get_ref().spec, gateway.spec, "the config survived both ways");
    // A refusal still names its field through a compressed request.
    let mut bad = gateway;
    bad.spec.as_mut().unwrap().image.clear();
    let refused = client
        .update_gateway(UpdateGatewayRequest {
            gateway: Some(bad),
            update_mask: Some(prost_types::FieldMask { paths: vec!["spec.image".into()] }),
            validate_only: false,
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    let _ = std::fs::remove_dir_all(dir);
}
