//! gatewayctl as a user runs it: the real binary against a real
//! gateway-store process (SQLite), checking exit codes and which text goes
//! to stdout (data) and which to stderr (messages).

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use gantry_testkit::{binary, free_port, server_certificate, temp_dir};

use gantry_testkit::ctl::{ctl_at, ctl_command, exits, ok, write, CtlStore as Store};

fn gateway_json(store: &Store, name: &str) -> serde_json::Value {
    store.gateway_json(name)
}

#[test]
fn create_refuses_an_existing_name_and_changes_nothing() {
    let store = Store::start("ctl-create", &[]);
    let first = &["create", "edge", "--image", "ghcr.io/acme/gw:1", "-l", "team=payments"];
    assert_eq!(ok(store.ctl(first)), "gateway/edge created\n");
    let before = gateway_json(&store, "edge");

    let (stdout, stderr) =
        exits(1, store.ctl(&["create", "edge", "--image", "ghcr.io/acme/other:2"]));
    assert_eq!(stdout, "");
    assert!(stderr.contains("\"edge\" already exists"), "{stderr}");
    assert_eq!(gateway_json(&store, "edge"), before, "the existing gateway was changed");
    assert_eq!(before["metadata"]["labels"]["team"], "payments");
    assert_eq!(before["spec"]["image"], "ghcr.io/acme/gw:1");
}

#[test]
fn every_command_takes_name_and_type_slash_name() {
    let store = Store::start("ctl-names", &[]);
    ok(store.ctl(&["create", "gateway/edge", "--image", "ghcr.io/acme/gw:1"]));
    ok(store.ctl(&["create", "tail", "--image", "ghcr.io/acme/gw:1"]));
    let names = ok(store.ctl(&["get", "-o", "name"]));
    assert_eq!(names, "gateway/edge\ngateway/tail\n");

    for form in ["edge", "gateway/edge", "gateways/edge", "gw/edge"] {
        assert_eq!(gateway_json(&store, form)["metadata"]["name"], "edge", "{form}");
    }
    assert!(ok(store.ctl(&["describe", "gateway/edge"])).starts_with("Name:          edge\n"));
    assert_eq!(ok(store.ctl(&["retry", "gateway/edge"])), "gateway/edge retry requested\n");
    let (_, stderr) =
        exits(1, store.ctl(&["wait", "gateway/edge", "--for=condition=Ready", "--timeout=200ms"]));
    assert!(stderr.contains("timed out") && stderr.contains("gateway/edge"), "{stderr}");

    // What `get -o name` prints feeds `delete` (no reconciler has set a
    // finalizer here, so they are gone at once).
    let listed: Vec<&str> = names.lines().collect();
    let deleted = ok(store.ctl(&[&["delete"], listed.as_slice()].concat()));
    assert_eq!(deleted, "gateway/edge deleted\ngateway/tail deleted\n");
    assert_eq!(ok(store.ctl(&["get", "-o", "name"])), "");

    // Another resource type is a usage error that says what is accepted.
    for args in
        [&["get", "pod/edge"][..], &["delete", "deployment/edge"], &["describe", "gateway/"]]
    {
        let (stdout, stderr) = exits(2, store.ctl(args));
        assert_eq!(stdout, "");
        assert!(stderr.contains("gateway/NAME"), "{args:?}: {stderr}");
    }
}

#[test]
fn a_leading_resource_word_is_the_type_and_never_a_name() {
    let store = Store::start("ctl-resource-word", &[]);
    // `create gateway NAME`, as `kubectl create deployment NAME`.
    for name in ["gateway", "gw-5", "edge"] {
        ok(store.ctl(&["create", "gateway", name, "--image", "ghcr.io/acme/gw:1"]));
    }
    // kubectl's reflex: the gateway named "gateway" is not deleted.
    assert_eq!(ok(store.ctl(&["delete", "gateway", "gw-5"])), "gateway/gw-5 deleted\n");
    let names = ok(store.ctl(&["get", "gateways", "-o", "name"]));
    assert_eq!(names, "gateway/edge\ngateway/gateway\n");
    assert_eq!(ok(store.ctl(&["get", "gw", "edge", "-o", "name"])), "gateway/edge\n");
    assert_eq!(ok(store.ctl(&["get", "-o", "name", "gateway", "edge"])), "gateway/edge\n");
    assert!(ok(store.ctl(&["describe", "gw", "edge"])).starts_with("Name:          edge\n"));
    // The gateway named like the type: as the second word, or type/name.
    assert_eq!(ok(store.ctl(&["get", "gateway", "gateway", "-o", "name"])), "gateway/gateway\n");
    // Another Kubernetes resource word is refused, and says why.
    let (stdout, stderr) = exits(2, store.ctl(&["get", "pods"]));
    assert_eq!(stdout, "");
    assert!(stderr.contains("gateways only"), "{stderr}");
}

#[test]
fn describe_shows_the_events_a_compacted_store_still_has() {
    let history = ["--history-max-events", "5", "--watch-cache-events", "5"];
    let store = Store::start(
        "ctl-compacted",
        &[&history[..], &["--compaction-interval", "200ms"]].concat(),
    );
    ok(store.ctl(&["create", "edge", "--image", "ghcr.io/acme/gw:1"]));
    for round in 0..20 {
        ok(store.ctl(&["label", "edge", &format!("round={round}"), "--overwrite"]));
    }
    let revision = gateway_json(&store, "edge")["metadata"]["resourceVersion"].to_string();
    // Once the creation is compacted away, the events come from the mark.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let events = loop {
        let described = ok(store.ctl(&["describe", "edge"]));
        let events = described.split("Events:").nth(1).unwrap().to_string();
        assert!(!events.contains("not available"), "{described}");
        if !events.contains("ADDED") {
            break events;
        }
        assert!(std::time::Instant::now() < deadline, "never compacted: {described}");
    };
    let last = events.lines().last().unwrap();
    assert!(last.trim_start().starts_with(&revision), "the latest change shown: {events}");
    assert!(last.contains("MODIFIED"), "{events}");
}

#[test]
fn a_named_config_that_does_not_exist_is_an_error() {
    let store = Store::start("ctl-config", &[]);
    let missing = store.dir.join("no-such-config.yaml");
    let missing = missing.to_str().unwrap();
    let (stdout, stderr) = exits(1, store.ctl(&["--config", missing, "get"]));
    assert_eq!(stdout, "");
    assert!(stderr.contains(missing) && stderr.contains("does not exist"), "{stderr}");
    // The same through the environment.
    let out = ctl_command(&["--server", &store.server(), "get", "-o", "name"])
        .env("GANTRY_CONFIG", missing)
        .output()
        .unwrap();
    let (_, stderr) = exits(1, out);
    assert!(stderr.contains("does not exist") && stderr.contains("GANTRY_CONFIG"), "{stderr}");
    // The default config may be absent: an empty store lists nothing.
    let (stdout, _) = exits(0, store.ctl(&["get", "-o", "name"]));
    assert_eq!(stdout, "");
}

#[test]
fn connection_errors_say_what_is_wrong_and_what_to_do() {
    let plain = Store::start("ctl-conn-plain", &[]);
    let dir = temp_dir("ctl-conn-tls");
    let (ca, cert, key) = server_certificate("gateway-store", &["localhost"], &[[127, 0, 0, 1]]);
    let ca = write(&dir, "ca.pem", &ca);
    let cert = write(&dir, "tls.crt", &cert);
    let key = write(&dir, "tls.key", &key);
    let tls = Store::start("ctl-conn-tls", &["--tls-cert", &cert, "--tls-key", &key]);
    let plain_addr = plain.server().trim_start_matches("http://").to_string();
    let tls_https = tls.server().replace("http://", "https://");

    let cases: Vec<(String, Vec<&str>, &[&str])> = vec![
        // No scheme: said before any connection is tried.
        (plain_addr.clone(), vec![], &["no http:// or https:// scheme", "http://127.0.0.1:"]),
        // https:// to a plain-text store.
        (
            plain.server().replace("http://", "https://"),
            vec![],
            &["does not speak TLS", "use http://"],
        ),
        // http:// to a TLS store.
        (tls.server(), vec![], &["use https://"]),
        // https:// without the CA that signed the certificate.
        (tls_https.clone(), vec![], &["certificate", "--ca"]),
        // Nothing listening.
        (
            format!("http://127.0.0.1:{}", free_port()),
            vec![],
            &["connection refused", "Is gateway-store running"],
        ),
    ];
    for (server, extra, says) in cases {
        let args = [&extra[..], &["get"]].concat();
        let (stdout, stderr) = exits(1, ctl_at(&server, &args));
        assert_eq!(stdout, "", "{server}");
        for said in says {
            assert!(stderr.contains(said), "{server}: wanted {said:?} in {stderr}");
        }
        assert!(!stderr.contains("Retry in a moment"), "{server}: {stderr}");
    }
    // With the CA, the same TLS store answers.
    ok(ctl_at(&tls_https, &["--ca", &ca, "create", "edge", "--image", "ghcr.io/acme/gw:1"]));
    assert_eq!(ok(ctl_at(&tls_https, &["--ca", &ca, "get", "-o", "name"])), "gateway/edge\n");

    // Wrong credentials: the store answered, and says so.
    let authed = Store::start(
        "ctl-conn-auth",
        &["--tokens-file", &write(&dir, "tokens.csv", "right-token-0123456789,admin,admin\n")],
    );
    let (_, stderr) = exits(1, authed.ctl(&["--token", "wrong-token-0123456789", "get"]));
    assert!(stderr.contains("rejected the credentials") && stderr.contains("--token"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn apply_and_delete_try_every_item_and_report_each() {
    let store = Store::start("ctl-each", &[]);
    let good = |name: &str| {
        format!("metadata: {{name: {name}}}\nspec: {{image: ghcr.io/acme/{name}:1}}\n")
    };
    let docs = [
        good("one"),
        "metadata: {name: two}\nspec: {image: 'Not An Image'}\n".into(),
        good("three"),
    ]
    .join("---\n");
    let file = write(&store.dir, "three.yaml", &docs);
    let later = write(&store.dir, "later.yaml", &good("four"));
    let missing = store.dir.join("missing.yaml").display().to_string();

    let (stdout, stderr) =
        exits(1, store.ctl(&["apply", "-f", &file, "-f", &missing, "-f", &later]));
    assert_eq!(
        stdout, "gateway/one created\ngateway/three created\ngateway/four created\n",
        "every good document applied, in order"
    );
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: ")).collect();
    assert!(errors[0].starts_with("error: gateway/two: invalid gateway"), "{stderr}");
    assert!(stderr.contains("gateway.spec.image"), "the offending field: {stderr}");
    assert!(errors[1].starts_with(&format!("error: {missing}: cannot read")), "{stderr}");
    assert_eq!(errors[2], "error: 2 of 5 failed (each is reported above)", "{stderr}");
    assert_eq!(ok(store.ctl(&["get", "-o", "name"])), "gateway/four\ngateway/one\ngateway/three\n");

    let (stdout, stderr) = exits(1, store.ctl(&["delete", "one", "nobody", "gateway/three"]));
    assert_eq!(stdout, "gateway/one deleted\ngateway/three deleted\n");
    assert!(stderr.contains("error: gateway/nobody: ") && stderr.contains("not found"), "{stderr}");
    assert!(stderr.contains("1 of 3 failed"), "{stderr}");
    assert_eq!(ok(store.ctl(&["get", "-o", "name"])), "gateway/four\n");

    // All good: exit 0 and nothing on stderr.
    let (stdout, stderr) = exits(0, store.ctl(&["apply", "-f", &later]));
    assert_eq!((stdout.as_str(), stderr.as_str()), ("gateway/four unchanged\n", ""));
}

#[test]
fn messages_go_to_stderr_and_data_to_stdout() {
    let store = Store::start("ctl-streams", &[]);
    let (stdout, stderr) = exits(0, store.ctl(&["get"]));
    assert_eq!((stdout.as_str(), stderr.as_str()), ("", "No gateways found.\n"));
    let (stdout, stderr) = exits(0, store.ctl(&["get", "-o", "json"]));
    let list: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (list["kind"].as_str(), list["items"].as_array().map(Vec::len)),
        (Some("GatewayList"), Some(0))
    );
    assert_eq!(stderr, "");
    let (stdout, stderr) = exits(1, store.ctl(&["get", "nobody"]));
    assert_eq!(stdout, "");
    assert!(stderr.starts_with("error: ") && stderr.contains("\"nobody\" not found"), "{stderr}");
}

#[test]
fn get_watch_keeps_one_table() {
    let store = Store::start("ctl-get-watch", &[]);
    ok(store.ctl(&["create", "before", "--image", "ghcr.io/acme/gw:1"]));
    let mut watcher = ctl_command(&["--server", &store.server(), "get", "--watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    gantry_testkit::kill_after(&watcher, Duration::from_secs(60));
    let mut lines = BufReader::new(watcher.stdout.take().unwrap()).lines();
    let mut next = || lines.next().unwrap().unwrap();
    let header = next();
    let columns = ["NAME", "PHASE", "READY", "GENERATION", "OBSERVED", "AGE"];
    assert_eq!(header.split_whitespace().collect::<Vec<_>>(), columns);
    assert_eq!(
        next().split_whitespace().take(5).collect::<Vec<_>>(),
        ["before", "PENDING", "Unknown", "1", "0"]
    );

    ok(store.ctl(&["create", "after", "--image", "ghcr.io/acme/gw:1"]));
    ok(store.ctl(&["delete", "before"]));
    // Each change is one row of the same columns: no second header, no
    // repeat of the listing, no event column.
    let changes = [next(), next()];
    let rows: Vec<Vec<&str>> = changes.iter().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0][..5], ["after", "PENDING", "Unknown", "1", "0"], "{changes:?}");
    assert_eq!(rows[1][..5], ["before", "DELETING", "Unknown", "1", "0"], "{changes:?}");
    assert!(rows.iter().all(|r| r.len() == columns.len()), "{changes:?}");
    let _ = watcher.kill();
    let _ = watcher.wait();
}

/// The store revision as `get -o jsonpath` of the list shows nothing of
/// it: read a gateway's resourceVersion instead, and the list's length.
fn state(store: &Store) -> String {
    ok(store.ctl(&["get", "-o", "json"]))
}

#[test]
fn dry_run_server_runs_every_check_and_stores_nothing() {
    let store = Store::start("ctl-dry-run", &[]);
    ok(store.ctl(&["create", "edge", "--image", "ghcr.io/acme/gw:1", "-l", "team=a"]));
    let before = state(&store);
    let new = write(
        &store.dir,
        "new.yaml",
        "metadata: {name: fresh}\nspec: {image: ghcr.io/acme/gw:1}\n",
    );
    let changed = write(
        &store.dir,
        "changed.yaml",
        "metadata: {name: edge}\nspec: {image: ghcr.io/acme/gw:2}\n",
    );
    let bad =
        write(&store.dir, "bad.yaml", "metadata: {name: edge}\nspec: {image: 'Not An Image'}\n");

    let dry = |args: &[&str]| store.ctl(&[args, &["--dry-run=server"]].concat());
    assert_eq!(ok(dry(&["apply", "-f", &new])), "gateway/fresh created (server dry run)\n");
    assert_eq!(ok(dry(&["apply", "-f", &changed])), "gateway/edge configured (server dry run)\n");
    assert_eq!(
        ok(dry(&["create", "other", "--image", "ghcr.io/acme/gw:1"])),
        "gateway/other created (server dry run)\n"
    );
    assert_eq!(
        ok(dry(&["label", "edge", "team=b", "--overwrite"])),
        "gateway/edge labeled (server dry run)\n"
    );
    assert_eq!(ok(dry(&["delete", "edge"])), "gateway/edge deleted (server dry run)\n");
    // The same refusals as the real write.
    let (_, dry_refusal) = exits(1, dry(&["apply", "-f", &bad]));
    let (_, real_refusal) = exits(1, store.ctl(&["apply", "-f", &bad]));
    assert_eq!(dry_refusal, real_refusal);
    assert!(dry_refusal.contains("gateway.spec.image"), "{dry_refusal}");
    let (_, stderr) = exits(1, dry(&["create", "edge", "--image", "ghcr.io/acme/gw:1"]));
    assert!(stderr.contains("already exists"), "{stderr}");

    assert_eq!(state(&store), before, "a dry run changed the store");
}

#[test]
fn diff_shows_what_apply_would_change_with_kubectls_exit_codes() {
    let store = Store::start("ctl-diff", &[]);
    let file = |name: &str, image: &str| {
        write(
            &store.dir,
            &format!("{name}-{}.yaml", image.replace([':', '/'], "_")),
            &format!("metadata: {{name: {name}}}\nspec: {{image: {image}}}\n"),
        )
    };
    let same = file("edge", "ghcr.io/acme/gw:1.0");
    ok(store.ctl(&["apply", "-f", &same]));
    let before = state(&store);

    // No change: exit 0, nothing printed.
    let (stdout, stderr) = exits(0, store.ctl(&["diff", "-f", &same]));
    assert_eq!((stdout.as_str(), stderr.as_str()), ("", ""));

    // A change: exit 1, the lines that change (and the generation the
    // store would give it).
    let (stdout, _) = exits(1, store.ctl(&["diff", "-f", &file("edge", "ghcr.io/acme/gw:1.1")]));
    let changed: Vec<&str> = stdout
        .lines()
        .filter(|l| {
            (l.starts_with('-') || l.starts_with('+'))
                && !l.starts_with("---")
                && !l.starts_with("+++")
        })
        .collect();
    assert_eq!(
        changed,
        [
            "-  generation: 1",
            "+  generation: 2",
            "-  image: ghcr.io/acme/gw:1.0",
            "+  image: ghcr.io/acme/gw:1.1"
        ],
        "{stdout}"
    );
    // A new gateway: all of it is added.
    let (stdout, _) = exits(1, store.ctl(&["diff", "-f", &file("fresh", "ghcr.io/acme/gw:1.0")]));
    assert!(stdout.contains("+  name: fresh") && !stdout.contains("-  name:"), "{stdout}");

    // An error is above 1: an invalid document, an unreachable store.
    let (_, stderr) = exits(2, store.ctl(&["diff", "-f", &file("edge", "Not An Image")]));
    assert!(stderr.contains("gateway.spec.image"), "{stderr}");
    let unreachable = format!("http://127.0.0.1:{}", free_port());
    let (_, stderr) = exits(2, ctl_at(&unreachable, &["diff", "-f", &same]));
    assert!(stderr.contains("nothing is listening"), "{stderr}");

    assert_eq!(state(&store), before, "diff changed the store");
}

/// An editor for `edit`: a shell script run with the file as its argument.
fn editor(dir: &Path, name: &str, script: &str) -> String {
    let path = write(dir, name, script);
    format!("sh {path}")
}

fn edit_with(store: &Store, editor: &str, name: &str) -> Output {
    ctl_command(&["--server", &store.server(), "edit", name])
        .env("GANTRY_EDITOR", editor)
        .output()
        .unwrap()
}

#[test]
fn edit_writes_back_only_over_the_version_it_read() {
    let store = Store::start("ctl-edit", &[]);
    ok(store.ctl(&["create", "edge", "--image", "ghcr.io/acme/gw:1.0"]));

    // An edit: written back.
    let bump = editor(&store.dir, "bump.sh", "sed -i 's#gw:1.0#gw:1.1#' \"$1\"\n");
    assert_eq!(ok(edit_with(&store, &bump, "gateway/edge")), "gateway/edge edited\n");
    assert_eq!(gateway_json(&store, "edge")["spec"]["image"], "ghcr.io/acme/gw:1.1");
    assert_eq!(gateway_json(&store, "edge")["metadata"]["generation"], 2);

    // No change: cancelled, nothing written.
    let before = gateway_json(&store, "edge");
    let (_, stderr) = exits(0, edit_with(&store, "true", "edge"));
    assert!(stderr.contains("Edit cancelled"), "{stderr}");
    assert_eq!(gateway_json(&store, "edge"), before);

    // Someone else writes while the editor is open: the edit is refused,
    // the other write stands, and the edited copy is kept.
    let racer = format!(
        "{} --server {} label edge team=racer >/dev/null\nsed -i 's#gw:1.1#gw:9.9#' \"$1\"\n",
        binary("gatewayctl").display(),
        store.server()
    );
    let racing = editor(&store.dir, "race.sh", &racer);
    let (stdout, stderr) = exits(1, edit_with(&store, &racing, "edge"));
    assert_eq!(stdout, "");
    assert!(stderr.contains("changed it meanwhile"), "{stderr}");
    let saved = stderr.split("saved in ").nth(1).map(str::trim).expect("the saved copy's path");
    assert!(std::fs::read_to_string(saved).unwrap().contains("gw:9.9"), "the edit is kept");
    let after = gateway_json(&store, "edge");
    assert_eq!(after["metadata"]["labels"]["team"], "racer", "the other writer's change stands");
    assert_eq!(after["spec"]["image"], "ghcr.io/acme/gw:1.1", "the stale edit was not written");
    let _ = std::fs::remove_dir_all(Path::new(saved).parent().unwrap());

    // An edit that does not parse is refused and kept too.
    let broken = editor(&store.dir, "broken.sh", "echo 'spec: {imagee: x}' >> \"$1\"\n");
    let (_, stderr) = exits(1, edit_with(&store, &broken, "edge"));
    assert!(stderr.contains("imagee") && stderr.contains("saved in"), "{stderr}");
}

#[test]
fn jsonpath_custom_columns_sorting_and_table_flags() {
    let store = Store::start("ctl-output", &[]);
    for (name, image, team) in [
        ("b", "ghcr.io/acme/gw:3", "x"),
        ("a", "ghcr.io/acme/gw:2", "y"),
        ("c", "ghcr.io/acme/gw:1", "x"),
    ] {
        ok(store.ctl(&["create", name, "--image", image, "-l", &format!("team={team}")]));
    }
    let template = r#"-o=jsonpath={range .items[*]}{.metadata.name}={.spec.image}{"\n"}{end}"#;
    assert_eq!(
        ok(store.ctl(&["get", template])),
        "a=ghcr.io/acme/gw:2\nb=ghcr.io/acme/gw:3\nc=ghcr.io/acme/gw:1\n"
    );
    assert_eq!(ok(store.ctl(&["get", "a", "-o", "jsonpath={.metadata.labels.team}"])), "y");
    assert_eq!(
        ok(store.ctl(&["get", "-l", "team=x", "-o", "jsonpath={.items[*].metadata.name}"])),
        "b c"
    );

    let columns = "custom-columns=NAME:.metadata.name,IMAGE:{.spec.image},MISSING:.spec.route.host";
    let table = ok(store.ctl(&["get", "-o", columns, "--sort-by=.spec.image"]));
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(
        rows,
        [
            vec!["NAME", "IMAGE", "MISSING"],
            vec!["c", "ghcr.io/acme/gw:1", "<none>"],
            vec!["a", "ghcr.io/acme/gw:2", "<none>"],
            vec!["b", "ghcr.io/acme/gw:3", "<none>"],
        ]
    );
    let bare = ok(store.ctl(&[
        "get",
        "--no-headers",
        "--show-labels",
        "--sort-by={.metadata.labels.team}",
    ]));
    let rows: Vec<(&str, &str)> = bare
        .lines()
        .map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            (cells[0], *cells.last().unwrap())
        })
        .collect();
    assert_eq!(rows, [("b", "team=x"), ("c", "team=x"), ("a", "team=y")]);
    // Several names at once; one missing is reported and fails the command.
    let (stdout, stderr) = exits(1, store.ctl(&["get", "a", "gateway/nobody", "c", "-o", "name"]));
    assert_eq!(stdout, "gateway/a\ngateway/c\n");
    assert!(stderr.contains("\"nobody\" not found"), "{stderr}");

    for bad in ["jsonpath={.items", "custom-columns=NAME", "yml"] {
        let (_, stderr) = exits(2, store.ctl(&["get", "-o", bad]));
        assert!(stderr.contains("invalid value"), "{bad}: {stderr}");
    }
}

#[test]
fn label_delete_by_selector_file_and_all_and_apply_a_directory() {
    let store = Store::start("ctl-label-delete", &[]);
    let dir = store.dir.join("gateways");
    std::fs::create_dir_all(dir.join("more")).unwrap();
    for (path, name) in [("one.yaml", "one"), ("two.yml", "two"), ("more/three.json", "three")] {
        let doc = if path.ends_with("json") {
            format!(
                r#"{{"metadata": {{"name": "{name}"}}, "spec": {{"image": "ghcr.io/acme/gw:1"}}}}"#
            )
        } else {
            format!("metadata: {{name: {name}}}\nspec: {{image: ghcr.io/acme/gw:1}}\n")
        };
        std::fs::write(dir.join(path), doc).unwrap();
    }
    std::fs::write(dir.join("notes.txt"), "not a manifest").unwrap();
    let dir = dir.to_str().unwrap();
    assert_eq!(ok(store.ctl(&["apply", "-f", dir])), "gateway/one created\ngateway/two created\n");
    assert_eq!(
        ok(store.ctl(&["apply", "-R", "-f", dir])),
        "gateway/three created\ngateway/one unchanged\ngateway/two unchanged\n"
    );

    // label: set, refused without --overwrite, overwritten, removed.
    assert_eq!(ok(store.ctl(&["label", "one", "team=a", "tier=1"])), "gateway/one labeled\n");
    let (_, stderr) = exits(1, store.ctl(&["label", "one", "team=b"]));
    assert!(stderr.contains("--overwrite"), "{stderr}");
    assert_eq!(
        ok(store.ctl(&["label", "gateway/one", "team=b", "--overwrite"])),
        "gateway/one labeled\n"
    );
    assert_eq!(ok(store.ctl(&["label", "one", "tier-"])), "gateway/one labeled\n");
    assert_eq!(gateway_json(&store, "one")["metadata"]["labels"], serde_json::json!({"team": "b"}));
    ok(store.ctl(&["label", "two", "team=b"]));

    // delete -l, -f, --all; one way at a time.
    let (_, stderr) = exits(1, store.ctl(&["delete", "one", "--all"]));
    assert!(stderr.contains("one of them"), "{stderr}");
    assert_eq!(
        ok(store.ctl(&["delete", "-l", "team=b"])),
        "gateway/one deleted\ngateway/two deleted\n"
    );
    let three = format!("{dir}/more/three.json");
    assert_eq!(ok(store.ctl(&["delete", "-f", &three])), "gateway/three deleted\n");
    ok(store.ctl(&["apply", "-R", "-f", dir]));
    assert_eq!(
        ok(store.ctl(&["delete", "--all"])),
        "gateway/one deleted\ngateway/three deleted\ngateway/two deleted\n"
    );
    let (stdout, stderr) = exits(0, store.ctl(&["delete", "--all"]));
    assert_eq!((stdout.as_str(), stderr.as_str()), ("", "No gateways found.\n"));
}

#[test]
fn config_contexts_and_versions() {
    let store = Store::start("ctl-config-version", &[]);
    let config = write(
        &store.dir,
        "config.yaml",
        &format!(
            "current-context: here\ncontexts:\n  - name: here\n    server: {}\n  - name: elsewhere\n    server: http://127.0.0.1:{}\n",
            store.server(),
            free_port()
        ),
    );
    let with =
        |args: &[&str]| ctl_command(&[&["--config", &config], args].concat()).output().unwrap();
    let contexts = ok(with(&["config", "get-contexts"]));
    let rows: Vec<Vec<&str>> = contexts.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], ["CURRENT", "NAME", "SERVER"]);
    assert_eq!(rows[1][..2], ["*", "here"]);
    assert_eq!(rows[2][0], "elsewhere");
    assert_eq!(ok(with(&["config", "current-context"])), "here\n");

    let versions = ok(with(&["version"]));
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(versions, format!("Client Version: {version}\nServer Version: {version}\n"));

    assert_eq!(
        ok(with(&["config", "use-context", "elsewhere"])),
        "Switched to context \"elsewhere\".\n"
    );
    assert_eq!(ok(with(&["config", "current-context"])), "elsewhere\n");
    // The context is used: nothing listens there.
    let (_, stderr) = exits(1, with(&["version"]));
    assert!(stderr.contains("nothing is listening"), "{stderr}");
    assert_eq!(ok(with(&["version", "--client"])), format!("Client Version: {version}\n"));
    let (_, stderr) = exits(1, with(&["config", "use-context", "nowhere"]));
    assert!(stderr.contains("here, elsewhere"), "{stderr}");
}
