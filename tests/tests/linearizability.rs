//! Linearizability of gateway-store: 8 clients run random creates,
//! conditional and unconditional updates, gets and deletes on a few shared
//! gateways; the recorded history is checked against a sequential model
//! (`gantry_e2e::linearizability`). The same check must reject the history
//! once a stale read is injected into it, so the test can fail.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gantry_api::v1::{
    CreateGatewayRequest, DeleteGatewayRequest, Gateway, GatewaySpec, GetGatewayRequest,
    ObjectMeta, UpdateGatewayRequest,
};
use gantry_client::{ClientConfig, GatewayClient};
use gantry_e2e::linearizability::{linearize, Answer, Call, GatewayModel, Operation};
use gantry_e2e::{temp_dir, StoreProcess, TempPostgres};
use prost_types::FieldMask;
use tonic::Code;

const CLIENTS: usize = 8;
const OPS_PER_CLIENT: usize = 150;
const KEYS: usize = 4;

type History = Vec<(String, Operation<Call, Answer>)>;

fn gateway(name: &str, image: &str, resource_version: i64) -> Gateway {
    Gateway {
        metadata: Some(ObjectMeta { name: name.into(), resource_version, ..Default::default() }),
        spec: Some(GatewaySpec { image: image.into(), ..Default::default() }),
        status: None,
    }
}

fn rv(g: &Gateway) -> i64 {
    g.metadata.as_ref().map_or(0, |m| m.resource_version)
}

async fn run(client: &mut GatewayClient, key: &str, call: &Call) -> Answer {
    let written = |r: Result<tonic::Response<Gateway>, tonic::Status>| match r {
        Ok(g) => Ok(Answer::Written { resource_version: rv(g.get_ref()) }),
        Err(s) => Err(s),
    };
    let result = match call {
        Call::Create { image } => written(
            client
                .create_gateway(CreateGatewayRequest { gateway: Some(gateway(key, image, 0)) })
                .await,
        ),
        Call::Update { image, precondition } => written(
            client
                .update_gateway(UpdateGatewayRequest {
                    gateway: Some(gateway(key, image, *precondition)),
                    update_mask: Some(FieldMask { paths: vec!["spec".into()] }),
                })
                .await,
        ),
        Call::Get => client.get_gateway(GetGatewayRequest { name: key.into() }).await.map(|g| {
            let g = g.into_inner();
            Answer::Read {
                image: g.spec.clone().unwrap_or_default().image,
                resource_version: rv(&g),
            }
        }),
        Call::Delete { precondition } => client
            .delete_gateway(DeleteGatewayRequest {
                name: key.into(),
                resource_version: *precondition,
            })
            .await
            .map(|_| Answer::Deleted),
    };
    match result {
        Ok(answer) => answer,
        Err(s) if s.code() == Code::NotFound => Answer::NotFound,
        Err(s) if s.code() == Code::AlreadyExists => Answer::AlreadyExists,
        Err(s) if s.code() == Code::Aborted => Answer::Conflict,
        Err(s) => panic!("{call:?} on {key}: unexpected {:?}: {}", s.code(), s.message()),
    }
}

async fn record_history(endpoint: String) -> History {
    let epoch = Instant::now();
    let history: Arc<Mutex<History>> = Arc::default();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let history = history.clone();
        let mut client = ClientConfig { endpoint: endpoint.clone(), ..Default::default() }
            .connect_lazy()
            .unwrap();
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(c as u64);
            // The last resource_version this client saw per key: its
            // preconditions are sometimes stale, as real clients' are.
            let mut seen: HashMap<String, i64> = HashMap::new();
            for i in 0..OPS_PER_CLIENT {
                let key = format!("k{}", rng.usize(0..KEYS));
                let known = seen.get(&key).copied().unwrap_or(0);
                let precondition = if rng.bool() { known } else { 0 };
                let image = format!("img:{c}-{i}");
                let call = match rng.u8(0..10) {
                    0..=1 => Call::Create { image },
                    2..=4 => Call::Update { image, precondition },
                    5..=8 => Call::Get,
                    _ => Call::Delete { precondition },
                };
                let call_at = epoch.elapsed().as_nanos() as u64;
                let answer = run(&mut client, &key, &call).await;
                let ret = epoch.elapsed().as_nanos() as u64;
                match &answer {
                    Answer::Written { resource_version }
                    | Answer::Read { resource_version, .. } => {
                        seen.insert(key.clone(), *resource_version);
                    }
                    _ => {}
                }
                let op = Operation { call: call_at, ret, input: call, output: answer };
                history.lock().unwrap().push((key, op));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let history = history.lock().unwrap().clone();
    history
}

fn by_key(history: &History) -> HashMap<String, Vec<Operation<Call, Answer>>> {
    let mut keys: HashMap<String, Vec<Operation<Call, Answer>>> = HashMap::new();
    for (key, op) in history {
        keys.entry(key.clone()).or_default().push(op.clone());
    }
    keys
}

async fn history_is_linearizable(endpoint: String, label: &str) {
    let history = record_history(endpoint).await;
    let keys = by_key(&history);
    for (key, ops) in &keys {
        assert!(
            linearize(&GatewayModel, ops).is_some(),
            "{label}: the history of {key} is not linearizable: {ops:#?}"
        );
    }
    let count = |f: fn(&Answer) -> bool| history.iter().filter(|(_, o)| f(&o.output)).count();
    eprintln!(
        "{label}: {} operations on {} keys linearizable ({} writes, {} reads, {} conflicts, {} not found)",
        history.len(),
        keys.len(),
        count(|a| matches!(a, Answer::Written { .. } | Answer::Deleted)),
        count(|a| matches!(a, Answer::Read { .. })),
        count(|a| matches!(a, Answer::Conflict)),
        count(|a| matches!(a, Answer::NotFound)),
    );

    // Inject a bug: a read answers what an earlier read saw although a
    // write completed in between (images are unique, so that value cannot
    // come back). The checker must refuse the history.
    let (key, ops) = keys
        .iter()
        .find_map(|(key, ops)| {
            let mut ops = ops.clone();
            ops.sort_by_key(|o| o.call);
            let is_read = |o: &Operation<Call, Answer>| matches!(o.output, Answer::Read { .. });
            let is_write = |o: &Operation<Call, Answer>| {
                matches!(o.output, Answer::Written { .. } | Answer::Deleted)
            };
            let (r, e) = (0..ops.len()).filter(|r| is_read(&ops[*r])).find_map(|r| {
                (0..r)
                    .filter(|e| is_read(&ops[*e]) && ops[*e].ret < ops[r].call)
                    .find(|e| {
                        ops.iter()
                            .any(|w| is_write(w) && w.call > ops[*e].ret && w.ret < ops[r].call)
                    })
                    .map(|e| (r, e))
            })?;
            ops[r].output = ops[e].output.clone();
            Some((key.clone(), ops))
        })
        .expect("a key with a read, a later write and a later read");
    assert!(
        linearize(&GatewayModel, &ops).is_none(),
        "{label}: the checker accepted a stale read injected into {key}'s history"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_is_linearizable() {
    let dir = temp_dir("linearizable-sqlite");
    let url = format!("sqlite://{}", dir.join("gantry.db").display());
    let store = StoreProcess::start(&url, &dir);
    history_is_linearizable(store.endpoint(), "sqlite").await;
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_is_linearizable() {
    let Some(db) = TempPostgres::create().await else { return };
    let dir = temp_dir("linearizable-postgres");
    let store = StoreProcess::start(&db.url, &dir);
    history_is_linearizable(store.endpoint(), "postgres").await;
    drop(store);
    db.drop_database().await;
    let _ = std::fs::remove_dir_all(dir);
}
