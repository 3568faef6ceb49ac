//! Linearizability of gateway-store: 8 clients run random creates,
//! conditional and unconditional updates, gets and deletes on a few shared
//! gateways, while a store process is killed and restarted in the middle;
//! on PostgreSQL the clients are spread over two replicas. Each key's
//! history, closed by a final read, is checked against a sequential model
//! (`gantry_testkit::linearizability`), and the revisions of all writes must be
//! unique and in real-time order across keys. The same checks must reject
//! the history once a stale read, a lost final write or a repeated
//! revision is injected into it, so the test can fail.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gantry_api::v1::{
    CreateGatewayRequest, DeleteGatewayRequest, Gateway, GetGatewayRequest, UpdateGatewayRequest,
};
use gantry_client::{ClientConfig, GatewayClient};
use gantry_testkit::eventually;
use gantry_testkit::gateway::gateway;
use gantry_testkit::linearizability::{
    linearize, revisions_unique_and_in_real_time_order, Answer, Call, GatewayModel, Operation,
};
use gantry_testkit::{temp_dir, StoreProcess, TestDatabase};
use prost_types::FieldMask;
use tonic::Code;

const CLIENTS: usize = 8;
const OPS_PER_CLIENT: usize = 150;
const KEYS: usize = 4;

type History = Vec<(String, Operation<Call, Answer>)>;

fn rv(g: &Gateway) -> i64 {
    g.metadata.as_ref().map_or(0, |m| m.resource_version)
}

/// What a call answered; `None` when it never reached the store (nothing
/// to record).
async fn run(client: &mut GatewayClient, key: &str, call: &Call) -> Option<Answer> {
    let written = |r: Result<tonic::Response<Gateway>, tonic::Status>| match r {
        Ok(g) => Ok(Answer::Written { resource_version: rv(g.get_ref()) }),
        Err(s) => Err(s),
    };
    let result = match call {
        Call::Create { image } => written(
            client
                .create_gateway(CreateGatewayRequest {
                    gateway: Some(gateway(key).image(image).at_version(0).build()),
                    validate_only: false,
                })
                .await,
        ),
        Call::Update { image, precondition } => written(
            client
                .update_gateway(UpdateGatewayRequest {
                    gateway: Some(gateway(key).image(image).at_version(*precondition).build()),
                    update_mask: Some(FieldMask { paths: vec!["spec".into()] }),
                    validate_only: false,
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
                validate_only: false,
            })
            .await
            .map(|_| Answer::Deleted),
    };
    match result {
        Ok(answer) => Some(answer),
        Err(s) if s.code() == Code::NotFound => Some(Answer::NotFound),
        Err(s) if s.code() == Code::AlreadyExists => Some(Answer::AlreadyExists),
        Err(s) if s.code() == Code::Aborted => Some(Answer::Conflict),
        // The store is down (restarting): the call never left.
        Err(s) if format!("{s:?}").contains("Connection refused") => None,
        // Cut off in flight by the kill: a write may have committed.
        Err(s) if matches!(s.code(), Code::Unavailable | Code::Unknown | Code::Cancelled) => {
            (!matches!(call, Call::Get)).then_some(Answer::Maybe)
        }
        Err(s) => panic!("{call:?} on {key}: unexpected {:?}: {}", s.code(), s.message()),
    }
}

/// Runs the clients (client `c` on `endpoints[c % len]`) and, once half
/// the operations are done, kills and restarts `restart`; then reads every
/// key once more.
async fn record_history(endpoints: Vec<String>, restart: &mut StoreProcess) -> History {
    let epoch = Instant::now();
    let history: Arc<Mutex<History>> = Arc::default();
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let (history, done) = (history.clone(), done.clone());
        let endpoint = endpoints[c % endpoints.len()].clone();
        let mut client = ClientConfig { endpoint, ..Default::default() }.connect_lazy().unwrap();
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
                done.fetch_add(1, Ordering::Relaxed);
                let Some(answer) = answer else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                match &answer {
                    Answer::Written { resource_version }
                    | Answer::Read { resource_version, .. } => {
                        seen.insert(key.clone(), *resource_version);
                    }
                    _ => {}
                }
                // An answer that never came: it may take effect at any
                // time after its call.
                let ret = if answer == Answer::Maybe { u64::MAX } else { ret };
                let op = Operation { call: call_at, ret, input: call, output: answer };
                history.lock().unwrap().push((key, op));
            }
        }));
    }
    let half = CLIENTS * OPS_PER_CLIENT / 2;
    eventually(Duration::from_secs(120), "half the operations done", || async {
        done.load(Ordering::Relaxed) >= half
    })
    .await;
    tokio::task::block_in_place(|| {
        restart.kill9();
        restart.spawn();
    });
    for t in tasks {
        t.await.unwrap();
    }
    // A final read of every key, after everything else. One more key, no
    // client touched, is created first: the checker's self-test below needs
    // a key that exists at the end, and the random workload may have
    // deleted every other one.
    let mut client = ClientConfig { endpoint: endpoints[0].clone(), ..Default::default() }
        .connect_lazy()
        .unwrap();
    let last = format!("k{KEYS}");
    let finals = [(last.clone(), Call::Create { image: "img:final".into() })]
        .into_iter()
        .chain((0..=KEYS).map(|k| (format!("k{k}"), Call::Get)));
    for (key, call) in finals {
        let call_at = epoch.elapsed().as_nanos() as u64;
        let answer = run(&mut client, &key, &call).await.expect("the final calls are answered");
        let ret = epoch.elapsed().as_nanos() as u64;
        let op = Operation { call: call_at, ret, input: call, output: answer };
        history.lock().unwrap().push((key, op));
    }
    let history = history.lock().unwrap().clone();
    history
}

/// Every acknowledged write as (call, return, revision).
fn writes(history: &History) -> Vec<(u64, u64, i64)> {
    history
        .iter()
        .filter_map(|(_, o)| match o.output {
            Answer::Written { resource_version } => Some((o.call, o.ret, resource_version)),
            _ => None,
        })
        .collect()
}

fn by_key(history: &History) -> HashMap<String, Vec<Operation<Call, Answer>>> {
    let mut keys: HashMap<String, Vec<Operation<Call, Answer>>> = HashMap::new();
    for (key, op) in history {
        keys.entry(key.clone()).or_default().push(op.clone());
    }
    keys
}

async fn history_is_linearizable(endpoints: Vec<String>, restart: &mut StoreProcess, label: &str) {
    let history = record_history(endpoints, restart).await;
    let keys = by_key(&history);
    if let Err(violation) = revisions_unique_and_in_real_time_order(&writes(&history)) {
        panic!("{label}: {violation}");
    }
    for (key, ops) in &keys {
        assert!(
            linearize(&GatewayModel, ops).is_some(),
            "{label}: the history of {key} is not linearizable: {ops:#?}"
        );
    }
    let count = |f: fn(&Answer) -> bool| history.iter().filter(|(_, o)| f(&o.output)).count();
    eprintln!(
        "{label}: {} operations on {} keys linearizable across a store restart ({} writes, {} reads, {} conflicts, {} not found, {} cut off)",
        history.len(),
        keys.len(),
        count(|a| matches!(a, Answer::Written { .. } | Answer::Deleted)),
        count(|a| matches!(a, Answer::Read { .. })),
        count(|a| matches!(a, Answer::Conflict)),
        count(|a| matches!(a, Answer::NotFound)),
        count(|a| matches!(a, Answer::Maybe)),
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

    // A lost write: a key's final read answers a value nobody wrote.
    let (key, mut ops) = keys
        .iter()
        .find(|(_, ops)| matches!(ops.last().unwrap().output, Answer::Read { .. }))
        .map(|(k, ops)| (k.clone(), ops.clone()))
        .expect("a key that exists at the end");
    if let Answer::Read { resource_version, .. } = ops.last().unwrap().output.clone() {
        ops.last_mut().unwrap().output =
            Answer::Read { image: "img:lost".into(), resource_version };
    }
    assert!(
        linearize(&GatewayModel, &ops).is_none(),
        "{label}: the checker accepted a final read of {key} that no write explains"
    );

    // A revision made twice: two writes on different keys share one.
    let mut repeated = writes(&history);
    let last = repeated.len() - 1;
    repeated[last].2 = repeated[0].2;
    assert!(
        revisions_unique_and_in_real_time_order(&repeated).is_err(),
        "{label}: the check accepted a revision made by two writes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_is_linearizable() {
    let dir = temp_dir("linearizable-sqlite");
    let url = format!("sqlite://{}", dir.join("gantry.db").display());
    let mut store = StoreProcess::start(&url, &dir);
    history_is_linearizable(vec![store.endpoint()], &mut store, "sqlite").await;
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replicas_are_linearizable() {
    let Some(db) = TestDatabase::postgres().await else { return };
    let dir = temp_dir("linearizable-postgres");
    let (dir_a, dir_b) = (dir.join("a"), dir.join("b"));
    std::fs::create_dir_all(&dir_a).unwrap();
    std::fs::create_dir_all(&dir_b).unwrap();
    let a = StoreProcess::start(&db.url, &dir_a);
    let mut b = StoreProcess::start(&db.url, &dir_b);
    let endpoints = vec![a.endpoint(), b.endpoint()];
    history_is_linearizable(endpoints, &mut b, "postgres, two replicas").await;
    drop((a, b));
    db.drop_database().await;
    let _ = std::fs::remove_dir_all(dir);
}
