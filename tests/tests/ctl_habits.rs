//! The kubectl reflexes of gatewayctl: patch, scale, annotate, create
//! --dry-run=client, wait --for=jsonpath, -v, --sort-by mistakes, config
//! view/set-context, XDG_CONFIG_HOME, no server at all, and completion
//! driven through the bash, zsh and fish functions it installs. The real
//! binary against a real gateway-store process.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use gantry_testkit::ctl::{ctl_command, exits, ok, text, write, CtlStore};
use gantry_testkit::{binary, in_ci, skipped, temp_dir};

#[test]
fn patch_scale_and_annotate_write_only_what_they_name() {
    let store = CtlStore::start("ctl-patch", &[]);
    ok(store.ctl(&["create", "edge", "--image", "x:1", "-l", "team=a"]));
    let merge =
        r#"{"spec":{"image":"x:2","config":{"a":"1"}},"metadata":{"labels":{"tier":"gold"}}}"#;
    assert_eq!(ok(store.ctl(&["patch", "gateway", "edge", "-p", merge])), "gateway/edge patched\n");
    let g = store.gateway_json("edge");
    assert_eq!(
        (g["spec"]["image"].as_str(), g["spec"]["config"]["a"].as_str()),
        (Some("x:2"), Some("1"))
    );
    assert_eq!(g["metadata"]["labels"], serde_json::json!({"team": "a", "tier": "gold"}));
    assert_eq!(g["metadata"]["generation"], 2);
    let json = r#"[{"op":"test","path":"/spec/image","value":"x:2"},{"op":"remove","path":"/spec/config/a"},{"op":"remove","path":"/metadata/labels/tier"}]"#;
    ok(store.ctl(&["patch", "edge", "--type", "json", "-p", json]));
    let g = store.gateway_json("edge");
    assert!(
        g["spec"].get("config").is_none() && g["metadata"]["labels"].get("tier").is_none(),
        "{g}"
    );
    assert_eq!(ok(store.ctl(&["patch", "edge", "-p", "{}"])), "gateway/edge patched (no change)\n");
    // What is not the user's to write is refused, and nothing changes.
    let before = store.gateway_json("edge");
    for (kind, patch) in [
        ("merge", r#"{"status":{"phase":"RUNNING"}}"#),
        ("json", r#"[{"op":"test","path":"/spec/image","value":"x:9"}]"#),
        ("merge", "not json"),
    ] {
        let (_, stderr) = exits(1, store.ctl(&["patch", "edge", "--type", kind, "-p", patch]));
        assert!(stderr.starts_with("error: "), "{stderr}");
    }
    assert_eq!(store.gateway_json("edge"), before);

    assert_eq!(ok(store.ctl(&["scale", "gw", "edge", "--replicas=3"])), "gateway/edge scaled\n");
    let (_, stderr) =
        exits(1, store.ctl(&["scale", "edge", "--replicas=5", "--current-replicas=2"]));
    assert!(stderr.contains("has 3 replicas"), "{stderr}");
    assert_eq!(store.gateway_json("edge")["spec"]["replicas"], 3);

    assert_eq!(ok(store.ctl(&["annotate", "edge", "owner=oncall"])), "gateway/edge annotated\n");
    let (_, stderr) = exits(1, store.ctl(&["annotate", "edge", "owner=other"]));
    assert!(stderr.contains("--overwrite"), "{stderr}");
    ok(store.ctl(&["annotate", "edge", "owner-"]));
    let g = store.gateway_json("edge");
    assert!(g["metadata"].get("annotations").is_none_or(|a| a.get("owner").is_none()), "{g}");
    assert_eq!(
        g["metadata"]["labels"],
        serde_json::json!({"team": "a"}),
        "annotate left labels alone"
    );
}

#[test]
fn create_dry_run_client_prints_a_manifest_apply_takes() {
    // No store at all: a client dry run asks nothing.
    let dir = temp_dir("ctl-dry-client");
    let out = ctl_command(&[
        "--server",
        "http://127.0.0.1:1",
        "create",
        "gateway",
        "edge",
        "--image",
        "x:1",
        "--replicas",
        "2",
        "-l",
        "team=a",
        "--dry-run=client",
        "-o",
        "yaml",
    ])
    .output()
    .unwrap();
    let manifest = ok(out);
    let parsed: serde_json::Value = serde_saphyr::from_str(&manifest).unwrap();
    assert_eq!(parsed["kind"], "Gateway", "{manifest}");
    assert_eq!(parsed["spec"]["replicas"], 2);
    let store = CtlStore::start("ctl-dry-client-store", &[]);
    let file = write(&dir, "edge.yaml", &manifest);
    assert_eq!(ok(store.ctl(&["apply", "-f", &file])), "gateway/edge created\n");
    let (_, stderr) = exits(1, store.ctl(&["label", "edge", "x=y", "--dry-run=client"]));
    assert!(stderr.contains("--dry-run=server"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn wait_for_jsonpath_verbose_calls_and_sort_by_mistakes() {
    let store = CtlStore::start("ctl-wait-jsonpath", &[]);
    ok(store.ctl(&["create", "edge", "--image", "x:1"]));
    // Met later, by another writer: once the wait has looked (its first
    // call, printed by -v=6), the label is set.
    let mut waiting = ctl_command(&[
        "--server",
        &store.server(),
        "-v=6",
        "wait",
        "edge",
        "--for=jsonpath={.metadata.labels.team}=b",
        "--timeout=30s",
    ])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let mut calls = std::io::BufReader::new(waiting.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("GetGateway OK") {
        line.clear();
        assert!(
            std::io::BufRead::read_line(&mut calls, &mut line).unwrap() > 0,
            "wait ended early"
        );
    }
    ok(store.ctl(&["label", "edge", "team=b"]));
    let waited = waiting.wait_with_output().unwrap();
    assert_eq!(ok(waited), "gateway/edge condition met\n");
    let (_, stderr) = exits(
        1,
        store.ctl(&["wait", "edge", "--for=jsonpath={.spec.image}=x:9", "--timeout=300ms"]),
    );
    assert!(
        stderr.contains("timed out") && stderr.contains("jsonpath={.spec.image}=x:9"),
        "{stderr}"
    );

    // -v=6: each call to the store, with its gRPC code, on stderr only.
    let out = store.ctl(&["-v=6", "get", "edge", "missing", "-o", "name"]);
    let (stdout, stderr) = exits(1, out);
    assert_eq!(stdout, "gateway/edge\n");
    assert!(stderr.contains("gantry.v1.GatewayService/GetGateway OK in"), "{stderr}");
    assert!(stderr.contains("gantry.v1.GatewayService/GetGateway NOT_FOUND in"), "{stderr}");
    let quiet = text(&store.ctl(&["get", "edge"]).stderr);
    assert!(!quiet.contains("GatewayService"), "{quiet}");

    let (_, stderr) = exits(1, store.ctl(&["get", "--sort-by", ".spec.imag"]));
    assert!(
        stderr.contains("couldn't find any field with path") && stderr.contains(".spec.imag"),
        "{stderr}"
    );
}

/// gatewayctl with only `env` (and PATH) set.
fn ctl_env(env: &[(&str, &Path)], args: &[&str]) -> std::process::Output {
    let mut command = ctl_command(args);
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().unwrap()
}

#[test]
fn config_view_set_context_and_where_the_config_lives() {
    let store = CtlStore::start("ctl-config-habits", &[]);
    let home = temp_dir("ctl-config-home");
    let xdg = home.join("xdg");
    let env = [("HOME", home.as_path()), ("XDG_CONFIG_HOME", xdg.as_path())];
    // Nothing configured: said so, with what to do.
    let (_, stderr) = exits(1, ctl_env(&env, &["get"]));
    assert!(stderr.contains("no store to talk to") && stderr.contains("set-context"), "{stderr}");

    let server = store.server();
    let (_, stderr) = exits(1, ctl_env(&env, &["config", "set-context", "local"]));
    assert!(stderr.contains("--server"), "a new context needs its server: {stderr}");
    let created = ctl_env(
        &env,
        &["config", "set-context", "local", "--server", &server, "--token", "secret-token"],
    );
    assert_eq!(ok(created), "Context \"local\" created.\n");
    assert!(xdg.join("gantry/config.yaml").is_file(), "the config is under XDG_CONFIG_HOME");
    assert!(!home.join(".config/gantry/config.yaml").exists());
    let modified = ctl_env(&env, &["config", "set-context", "--current", "--token", ""]);
    assert_eq!(ok(modified), "Context \"local\" modified.\n");
    ok(ctl_env(&env, &["config", "set-context", "local", "--token", "secret-token"]));
    let view = ok(ctl_env(&env, &["config", "view"]));
    assert!(view.contains("REDACTED") && !view.contains("secret-token"), "{view}");
    assert!(ok(ctl_env(&env, &["config", "view", "--raw"])).contains("secret-token"));
    // The context set is the one used.
    ok(ctl_env(&env, &["config", "set-context", "local", "--token", ""]));
    ok(ctl_env(&env, &["create", "edge", "--image", "x:1"]));
    assert_eq!(ok(store.ctl(&["get", "-o", "name"])), "gateway/edge\n");
    let _ = std::fs::remove_dir_all(home);
}

#[test]
fn contexts_take_a_token_file_or_a_command_as_kubeconfig_does() {
    let tokens = "file-token-0000000000001,from-file,editor\ncommand-token-00000000001,from-command,viewer\n";
    let home = temp_dir("ctl-credentials");
    let tokens_file = home.join("tokens.csv");
    std::fs::write(&tokens_file, tokens).unwrap();
    let store =
        CtlStore::start("ctl-credentials", &["--tokens-file", tokens_file.to_str().unwrap()]);
    let env = [("HOME", home.as_path())];
    let server = store.server();
    let set = |args: &[&str]| ok(ctl_env(&env, &[&["config", "set-context"], args].concat()));

    // A token file (a projected token, say), read when used: rotating it
    // needs no config change.
    let file = home.join("token");
    std::fs::write(&file, "file-token-0000000000001\n").unwrap();
    set(&["files", "--server", &server, "--token-file", file.to_str().unwrap(), "--current"]);
    // The editor's token creates; the file changed to the viewer's, the
    // next command is the viewer.
    ok(ctl_env(&env, &["create", "edge", "--image", "x:1"]));
    std::fs::write(&file, "command-token-00000000001\n").unwrap();
    let (_, stderr) = exits(1, ctl_env(&env, &["create", "other", "--image", "x:1"]));
    assert!(stderr.contains("not allowed") && stderr.contains("role viewer"), "{stderr}");

    // A command printing an ExecCredential, as kubectl's exec plugins do,
    // and one printing the token alone.
    let credential = r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"command-token-00000000001"}}"#;
    let script = home.join("credential.sh");
    std::fs::write(&script, format!("#!/bin/sh\nprintf '%s' '{credential}'\n")).unwrap();
    let bare = home.join("bare.sh");
    std::fs::write(&bare, "#!/bin/sh\necho file-token-0000000000001\n").unwrap();
    let failing = home.join("failing.sh");
    std::fs::write(&failing, "#!/bin/sh\necho 'login expired' >&2\nexit 3\n").unwrap();
    for path in [&script, &bare, &failing] {
        assert!(Command::new("chmod").arg("+x").arg(path).status().unwrap().success());
    }
    set(&[
        "exec",
        "--server",
        &server,
        "--token-command",
        &format!("sh {}", script.display()),
        "--current",
    ]);
    assert_eq!(ok(ctl_env(&env, &["get", "-o", "name"])), "gateway/edge\n");
    let (_, stderr) = exits(1, ctl_env(&env, &["delete", "edge"]));
    assert!(stderr.contains("role viewer"), "the viewer's token: {stderr}");
    set(&["exec", "--token-command", bare.to_str().unwrap()]);
    ok(ctl_env(&env, &["delete", "edge"]));
    set(&["exec", "--token-command", failing.to_str().unwrap()]);
    let (_, stderr) = exits(1, ctl_env(&env, &["get"]));
    assert!(stderr.contains("token_command") && stderr.contains("failed"), "{stderr}");
    assert!(stderr.contains("login expired"), "the command's own stderr is shown: {stderr}");
    // `config view` hides the command's arguments (they may hold secrets).
    set(&["exec", "--token-command", "kubectl oidc-login get-token --oidc-client-secret=s3cret"]);
    let view = ok(ctl_env(&env, &["config", "view"]));
    assert!(!view.contains("s3cret") && view.contains("kubectl"), "{view}");
    let _ = std::fs::remove_dir_all(home);
}

#[test]
fn a_client_certificate_names_the_caller_and_the_server_is_checked_by_name() {
    let home = temp_dir("ctl-mtls");
    let file = |name: &str, content: &str| {
        let path = home.join(name);
        std::fs::write(&path, content).unwrap();
        path.to_str().unwrap().to_string()
    };
    let (server_ca, client_ca) =
        (gantry_testkit::TestCa::new("server-ca"), gantry_testkit::TestCa::new("client-ca"));
    let (cert, key) = server_ca.server(&["gateway-store.gantry.svc"]);
    let (alice_cert, alice_key) = client_ca.client("alice", &["platform"], -60, 3600);
    let (bob_cert, bob_key) = client_ca.client("bob", &[], -60, 3600);
    let bindings =
        "bindings:\n  - role: editor\n    subjects:\n      - {kind: Group, name: platform}\n";
    let flags = [
        "--tokens-file".to_string(),
        file("tokens.csv", "admin-token-000000000001,root,admin\n"),
        "--tls-cert".into(),
        file("server.crt", &cert),
        "--tls-key".into(),
        file("server.key", &key),
        "--client-ca".into(),
        file("client-ca.pem", &client_ca.pem),
        "--role-bindings-file".into(),
        file("bindings.yaml", bindings),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let store = CtlStore::start("ctl-mtls", &flags);
    let server = format!("https://127.0.0.1:{}", store.process.grpc);
    let ca = file("server-ca.pem", &server_ca.pem);
    let (alice_cert, alice_key) = (file("alice.crt", &alice_cert), file("alice.key", &alice_key));
    let as_alice = |extra: &[&str], args: &[&str]| {
        let common = [
            "--server",
            &server,
            "--ca",
            &ca,
            "--client-certificate",
            &alice_cert,
            "--client-key",
            &alice_key,
        ];
        ctl_command(&[&common[..], extra, args].concat()).output().unwrap()
    };
    // The certificate names gateway-store.gantry.svc, not 127.0.0.1.
    let (_, stderr) = exits(1, as_alice(&[], &["get"]));
    assert!(!stderr.is_empty(), "a server certificate for another name was taken");
    let named = ["--tls-server-name", "gateway-store.gantry.svc"];
    ok(as_alice(&named, &["create", "edge", "--image", "x:1"]));
    // Bob's certificate is good, but no binding names him.
    let (bob_cert, bob_key) = (file("bob.crt", &bob_cert), file("bob.key", &bob_key));
    let env = [("HOME", home.as_path())];
    let set = |args: &[&str]| ok(ctl_env(&env, &[&["config", "set-context"], args].concat()));
    set(&[
        "bob",
        "--server",
        &server,
        "--ca",
        &ca,
        "--client-certificate",
        &bob_cert,
        "--client-key",
        &bob_key,
        "--tls-server-name",
        "gateway-store.gantry.svc",
        "--current",
    ]);
    let (_, stderr) = exits(1, ctl_env(&env, &["get"]));
    assert!(stderr.contains("bob") && stderr.contains("no role"), "{stderr}");
    // The same context with alice's certificate lists what she made.
    set(&["bob", "--client-certificate", &alice_cert, "--client-key", &alice_key]);
    assert_eq!(ok(ctl_env(&env, &["get", "-o", "name"])), "gateway/edge\n");
    let _ = std::fs::remove_dir_all(home);
}

/// The shells whose completion functions are driven; `None` (skipped
/// outside CI) when one is missing.
fn shells() -> Option<()> {
    let missing: Vec<&str> = ["bash", "zsh", "fish"]
        .into_iter()
        .filter(|s| Command::new(s).arg("--version").output().is_err())
        .collect();
    if missing.is_empty() {
        return Some(());
    }
    assert!(
        !in_ci(),
        "CI=true but {missing:?} are missing: tests/k8s/setup.sh shells installs them"
    );
    skipped(&format!(
        "{missing:?} not installed (tests/k8s/setup.sh shells): completion not driven"
    ));
    None
}

/// What `shell` offers after `line` (ending where TAB is pressed),
/// through the function `gatewayctl completion SHELL` prints.
fn complete(shell: &str, line: &str, env: &[(&str, String)]) -> Vec<String> {
    let bin_dir = binary("gatewayctl").parent().unwrap().display().to_string();
    let words: Vec<String> = shlex_words(line);
    let script = match shell {
        "bash" => format!(
            "source <(gatewayctl completion bash); COMP_WORDS=({words}); COMP_CWORD={last}; COMP_TYPE=9; \
             _clap_complete_gatewayctl gatewayctl {current:?} {previous:?}; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            words = words.iter().map(|w| format!("{w:?}")).collect::<Vec<_>>().join(" "),
            last = words.len() - 1,
            current = words.last().unwrap(),
            previous = words[words.len() - 2],
        ),
        "zsh" => format!(
            "compdef() {{ :; }}; _describe() {{ print -rl -- \"${{(@P)3}}\"; }}; \
             source <(gatewayctl completion zsh); words=({words}); CURRENT={count}; _clap_dynamic_completer_gatewayctl",
            words = words.iter().map(|w| format!("{w:?}")).collect::<Vec<_>>().join(" "),
            count = words.len(),
        ),
        _ => format!("gatewayctl completion fish | source; complete -C {line:?}"),
    };
    let mut command = Command::new(shell);
    if shell == "zsh" {
        command.arg("-f");
    }
    command
        .arg("-c")
        .arg(&script)
        .env("PATH", format!("{bin_dir}:{}", std::env::var("PATH").unwrap()))
        .env_remove("GANTRY_SERVER")
        .env_remove("GANTRY_CONFIG");
    for (key, value) in env {
        command.env(key, value);
    }
    let out = command.output().unwrap();
    assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
    // Candidates, their descriptions (after a tab or a colon) left off.
    text(&out.stdout)
        .lines()
        .map(|l| l.split(['\t', ':']).next().unwrap().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// `line` split at spaces, an empty last word when it ends with one.
fn shlex_words(line: &str) -> Vec<String> {
    line.split(' ').map(str::to_string).collect()
}

#[test]
fn completion_offers_gateways_contexts_and_formats_in_bash_zsh_and_fish() {
    if shells().is_none() {
        return;
    }
    let store = CtlStore::start("ctl-completion", &[]);
    for name in ["edge", "core"] {
        ok(store.ctl(&["create", name, "--image", "x:1"]));
    }
    let home = temp_dir("ctl-completion-home");
    let config = home.join("config.yaml");
    let config_text = format!(
        "current-context: local\ncontexts:\n- name: local\n  server: {}\n- name: prod\n  server: https://gateway-store:50051\n",
        store.server()
    );
    std::fs::write(&config, config_text).unwrap();
    let env =
        [("GANTRY_CONFIG", config.display().to_string()), ("HOME", home.display().to_string())];
    for shell in ["bash", "zsh", "fish"] {
        let has = |line: &str, wanted: &[&str]| {
            let offered = complete(shell, line, &env);
            for w in wanted {
                assert!(
                    offered.iter().any(|o| o == w),
                    "{shell}: {line:?} does not offer {w}: {offered:?}"
                );
            }
            offered
        };
        let names = has("gatewayctl describe ", &["core", "edge"]);
        assert!(!names.iter().any(|n| n == "prod"), "{shell}: a context offered as a gateway");
        has("gatewayctl delete gateway e", &["edge"]);
        has("gatewayctl get -o ", &["json", "yaml", "wide", "jsonpath="]);
        has("gatewayctl config use-context ", &["local", "prod"]);
        has("gatewayctl --context ", &["local", "prod"]);
    }
    let _ = std::fs::remove_dir_all(home);
}
