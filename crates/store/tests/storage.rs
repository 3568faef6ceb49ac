//! The storage layer directly, on both backends: a batch of writes commits
//! together, and a write refused inside a batch fails alone.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use gantry_api::v1::EventType;
use gantry_core::{lifecycle, Role, RuleError, Write};
use gantry_store::storage::{PendingWrite, StorageError};
use gantry_testkit::eventually;
use prost_types::Timestamp;

fn create_write(name: &str) -> PendingWrite {
    let request = gateway(name, "gw:1");
    PendingWrite {
        name: name.into(),
        mutation: Box::new(move |existing| {
            lifecycle::create(
                existing,
                request.clone(),
                Role::Editor,
                "uid".into(),
                Timestamp::default(),
            )
        }),
        dry_run: false,
    }
}

fn rejected(name: &str) -> PendingWrite {
    PendingWrite {
        name: name.into(),
        mutation: Box::new(|_| Err(RuleError::invalid("gateway.spec", "no"))),
        dry_run: false,
    }
}

fn unchanged(name: &str) -> PendingWrite {
    let name_owned = name.to_string();
    PendingWrite {
        name: name.into(),
        mutation: Box::new(move |current| match current {
            Some(g) => Ok(Write::Unchanged(g.clone())),
            None => Err(RuleError::NotFound(name_owned.clone())),
        }),
        dry_run: false,
    }
}

async fn a_failing_write_in_a_batch_fails_alone(store: &TestStore) {
    let storage = store.storage.clone();
    storage.write_batch(vec![create_write("taken")]).await.unwrap().pop().unwrap().unwrap();
    let before = store.event_revisions().await;

    let results = storage
        .write_batch(vec![
            create_write("one"),
            create_write("taken"),
            rejected("two"),
            create_write("two"),
            unchanged("one"),
            create_write("three"),
        ])
        .await
        .unwrap();
    assert_eq!(results.len(), 6);
    let kinds: Vec<Option<EventType>> = results
        .iter()
        .map(|r| r.as_ref().ok().and_then(|c| c.event.as_ref().map(|e| e.kind)))
        .collect();
    assert_eq!(
        kinds,
        [Some(EventType::Added), None, None, Some(EventType::Added), None, Some(EventType::Added)]
    );
    assert!(
        matches!(results[1], Err(StorageError::Rule(RuleError::AlreadyExists(_)))),
        "{:?}",
        results[1]
    );
    assert!(matches!(results[2], Err(StorageError::Rule(RuleError::Invalid(_)))));
    assert!(matches!(results[4], Ok(ref c) if c.event.is_none()));

    for name in ["one", "two", "three", "taken"] {
        assert!(storage.get(name).await.unwrap().is_some(), "{name}");
    }
    let after = store.event_revisions().await;
    assert_eq!(after.len() - before.len(), 3, "one event per committed change");
    assert!(after.windows(2).all(|w| w[1] == w[0] + 1), "no revision spent on a failed write");
    let revisions: Vec<i64> = results
        .iter()
        .filter_map(|r| r.as_ref().ok()?.event.as_ref().map(|e| e.revision))
        .collect();
    assert_eq!(revisions, after[before.len()..]);
}

async fn a_batch_of_only_failures_writes_nothing(store: &TestStore) {
    let storage = store.storage.clone();
    let before = store.event_revisions().await;
    let results = storage.write_batch(vec![rejected("x")]).await.unwrap();
    assert!(results[0].is_err());
    assert_eq!(store.event_revisions().await, before);
    assert_eq!(storage.current_revision().await.unwrap(), before.last().copied().unwrap_or(1));
}

/// A statement of a batch that the database refuses (a trigger raising an
/// error on the event of the name `poison`): the whole batch fails as not
/// committed (not as an unknown outcome), nothing of it is stored, and the
/// writer's connection is left usable (on SQLite the batch begins and
/// commits its transaction in its own statements, so a connection left
/// mid-transaction would refuse every later batch).
async fn a_batch_the_database_refuses_writes_nothing_and_the_next_commits(store: &TestStore) {
    let storage = store.storage.clone();
    storage.write_batch(vec![create_write("before")]).await.unwrap().pop().unwrap().unwrap();
    store
        .execute_raw(match store.backend {
            Backend::Sqlite => {
                "CREATE TRIGGER refuse_poison BEFORE INSERT ON gateway_events \
                 WHEN NEW.name = 'poison' BEGIN SELECT RAISE(ABORT, 'injected refusal'); END"
            }
            Backend::Postgres => {
                "CREATE FUNCTION refuse_poison() RETURNS trigger AS $$ BEGIN \
                 IF NEW.name = 'poison' THEN RAISE EXCEPTION 'injected refusal'; END IF; \
                 RETURN NEW; END $$ LANGUAGE plpgsql; \
                 CREATE TRIGGER refuse_poison BEFORE INSERT ON gateway_events \
                 FOR EACH ROW EXECUTE FUNCTION refuse_poison()"
            }
        })
        .await;
    let (events, revision) =
        (store.event_revisions().await, storage.current_revision().await.unwrap());

    for round in 0..3 {
        let refused = storage.write_batch(vec![create_write("fine"), create_write("poison")]).await;
        match refused {
            // PostgreSQL's error as sqlx returns it; SQLite's writer thread
            // says the batch did not commit, with SQLite's message.
            Err(e @ (StorageError::Database(_) | StorageError::NotCommitted(_))) => {
                assert!(e.to_string().contains("injected refusal"), "round {round}: {e}")
            }
            other => panic!("round {round}: the batch must fail as not committed: {other:?}"),
        }
        assert!(storage.get("fine").await.unwrap().is_none(), "round {round}");
        assert_eq!(store.event_revisions().await, events, "round {round}");
        assert_eq!(storage.current_revision().await.unwrap(), revision, "round {round}");
    }

    let committed = storage.write_batch(vec![create_write("fine")]).await.unwrap();
    let event = committed[0].as_ref().unwrap().event.clone().unwrap();
    assert_eq!(event.revision, revision + 1);
    assert!(storage.get("fine").await.unwrap().is_some());
    assert_eq!(store.event_revisions().await.last(), Some(&(revision + 1)));
}

on_both_backends!(
    a_failing_write_in_a_batch_fails_alone,
    a_batch_of_only_failures_writes_nothing,
    a_batch_the_database_refuses_writes_nothing_and_the_next_commits
);

/// Errors logged by the store while a test runs on one thread.
#[derive(Clone, Default)]
struct ErrorLog(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ErrorLog {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *event.metadata().level() == tracing::Level::ERROR {
            self.0.lock().unwrap().push(format!("{}: {event:?}", event.metadata().target()));
        }
    }
}

/// A committed SQLite batch of creates, an update and a removal reports
/// nothing wrong: the batch checks the rows it wrote against its plan and
/// logs a bug when they differ, so a miscounted plan (sqlx counts the
/// COMMIT too) would cry wolf on every write.
#[tokio::test]
async fn sqlite_a_committed_batch_of_every_kind_of_change_logs_no_error() {
    use tracing_subscriber::layer::SubscriberExt;
    let errors = ErrorLog::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(errors.clone()));
    let store = TestStore::start(Backend::Sqlite).await.unwrap();
    let storage = store.storage.clone();
    storage.write_batch(vec![create_write("a"), create_write("b")]).await.unwrap();
    let (a, b) =
        (storage.get("a").await.unwrap().unwrap(), storage.get("b").await.unwrap().unwrap());
    let mut incoming = a.clone();
    incoming.spec.as_mut().unwrap().image = "gw:2".into();
    let results = storage
        .write_batch(vec![
            create_write("c"),
            PendingWrite {
                name: "a".into(),
                mutation: Box::new(move |current| {
                    let mask = ["spec.image".to_string()];
                    lifecycle::update(
                        current.unwrap(),
                        &incoming,
                        &mask,
                        Role::Editor,
                        Timestamp::default(),
                    )
                }),
                dry_run: false,
            },
            PendingWrite {
                name: "b".into(),
                mutation: Box::new(move |current| {
                    let rv = b.metadata.as_ref().unwrap().resource_version;
                    lifecycle::delete(current.unwrap(), rv, Role::Editor, Timestamp::default())
                }),
                dry_run: false,
            },
        ])
        .await
        .unwrap();
    let kinds: Vec<EventType> =
        results.iter().map(|r| r.as_ref().unwrap().event.as_ref().unwrap().kind).collect();
    assert_eq!(kinds, [EventType::Added, EventType::Modified, EventType::Deleted]);
    assert!(storage.get("b").await.unwrap().is_none(), "removed");
    assert_eq!(storage.get("a").await.unwrap().unwrap().spec.unwrap().image, "gw:2");
    store.stop().await;
    assert_eq!(*errors.0.lock().unwrap(), Vec::<String>::new());
}

/// Store replicas cannot race on a name: every batch takes the revision
/// lock first. A writer that bypasses gateway-store and inserts a name
/// while a batch creating it runs makes the whole batch fail, with nothing
/// of it written and that writer's row left as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_row_inserted_behind_the_stores_back_fails_the_batch_cleanly() {
    use sqlx::Connection;
    let Some(store) = TestStore::start(Backend::Postgres).await else { return };
    let mut other = sqlx::PgConnection::connect(&store.database.url).await.unwrap();
    let mut racing = other.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO gateways (name, uid, generation, observed_generation, resource_version, deleting, object) \
         VALUES ('shared', 'other-replica', 1, 0, 0, FALSE, '')",
    )
    .execute(&mut *racing)
    .await
    .unwrap();

    let storage = store.storage.clone();
    let batch = tokio::spawn(async move {
        storage
            .write_batch(vec![create_write("b1"), create_write("shared"), create_write("b2")])
            .await
    });
    // Wait until the batch's insert of "shared" blocks on the racing
    // insert, then commit the racing insert.
    waiting_on_locks(&store.database.url, 1, "the batch reached the racing row").await;
    racing.commit().await.unwrap();
    let revision = store.storage.current_revision().await.unwrap();
    let failed = batch.await.unwrap().unwrap_err();
    assert!(
        matches!(failed, StorageError::NotCommitted(ref m) if m.contains("shared")),
        "{failed:?}"
    );
    for name in ["b1", "b2"] {
        assert!(store.storage.get(name).await.unwrap().is_none(), "{name} was written");
    }
    assert_eq!(store.storage.current_revision().await.unwrap(), revision, "a revision was spent");
    let shared = store.storage.get("shared").await.unwrap().unwrap();
    assert!(shared.metadata.is_none(), "the racing row stands");
    store.stop().await;
}

/// Waits until `n` statements of the test's database wait for a lock.
async fn waiting_on_locks(url: &str, n: i64, what: &str) {
    use sqlx::Connection;
    let watcher = tokio::sync::Mutex::new(sqlx::PgConnection::connect(url).await.unwrap());
    eventually(std::time::Duration::from_secs(30), what, || async {
        let (waiting,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut *watcher.lock().await)
        .await
        .unwrap();
        waiting >= n
    })
    .await;
}

/// A write adding the label `key` to the stored `name`, counting how many
/// times its rule ran.
fn add_label(
    name: &str,
    key: &str,
    runs: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> PendingWrite {
    let (target, key, runs) = (name.to_string(), key.to_string(), runs.clone());
    PendingWrite {
        name: name.into(),
        mutation: Box::new(move |current| {
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut g = current.cloned().ok_or_else(|| RuleError::NotFound(target.clone()))?;
            g.metadata.get_or_insert_with(Default::default).labels.insert(key.clone(), "1".into());
            Ok(Write::Put(g))
        }),
        dry_run: false,
    }
}

/// Two store replicas' batches read the same revision and row, then race
/// to write: the one that loses the compare-and-set on the revision
/// writes nothing, runs again behind the winner under the revision lock
/// (its rule run anew on the row as the winner left it) and takes the next
/// revision. Both succeed and no change is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_batch_that_loses_the_race_to_another_replica_runs_again_behind_it() {
    use sqlx::Connection;
    let Some(store) = TestStore::start(Backend::Postgres).await else { return };
    let url = store.database.url.clone();
    let (replica_a, replica_b) =
        (store.storage.clone(), gantry_store::open_storage(&url).await.unwrap());
    replica_a.write_batch(vec![create_write("shared")]).await.unwrap().pop().unwrap().unwrap();
    let revision = replica_a.current_revision().await.unwrap();
    // A writer holding the revision row (a third replica's batch, or
    // compaction) while both replicas read and plan.
    let mut other = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut holding = other.begin().await.unwrap();
    sqlx::query("UPDATE store_revision SET revision = revision WHERE id = 1")
        .execute(&mut *holding)
        .await
        .unwrap();
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut batches = Vec::new();
    for (replica, key) in [(replica_a, "a"), (replica_b, "b")] {
        let write = add_label("shared", key, &runs);
        batches.push(tokio::spawn(async move { replica.write_batch(vec![write]).await }));
    }
    waiting_on_locks(&url, 2, "both replicas' writes wait for the revision row").await;
    holding.commit().await.unwrap();
    let mut revisions = Vec::new();
    for batch in batches {
        let committed = batch.await.unwrap().unwrap().pop().unwrap().unwrap();
        revisions.push(committed.event.unwrap().revision);
    }
    revisions.sort();
    assert_eq!(revisions, [revision + 1, revision + 2]);
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 3, "the loser's rule ran again");
    let stored = store.storage.get("shared").await.unwrap().unwrap();
    let labels = stored.metadata.unwrap().labels;
    assert_eq!((labels.get("a"), labels.get("b")), (Some(&"1".into()), Some(&"1".into())));
    assert_eq!(store.event_revisions().await.last(), Some(&(revision + 2)));
    store.stop().await;
}

/// A replica plans a batch on the rows it knows from its own last commit
/// and skips the read; when another replica has written since, the
/// compare-and-set on the revision refuses that plan and the batch runs
/// again on a read: the other replica's change is kept, not overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_rows_known_from_the_last_commit_are_not_trusted_after_another_replica_wrote() {
    let Some(store) = TestStore::start(Backend::Postgres).await else { return };
    let (replica_a, replica_b) =
        (store.storage.clone(), gantry_store::open_storage(&store.database.url).await.unwrap());
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    replica_a.write_batch(vec![create_write("shared")]).await.unwrap().pop().unwrap().unwrap();
    replica_a.write_batch(vec![add_label("shared", "a1", &runs)]).await.unwrap();
    assert_eq!(runs.swap(0, std::sync::atomic::Ordering::SeqCst), 1);
    replica_b.write_batch(vec![add_label("shared", "b", &runs)]).await.unwrap();
    assert_eq!(runs.swap(0, std::sync::atomic::Ordering::SeqCst), 1);
    let committed =
        replica_a.write_batch(vec![add_label("shared", "a2", &runs)]).await.unwrap().pop();
    // Planned on what it knew, refused, planned again on a read.
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2, "known rows were not tried");
    let gateway = committed.unwrap().unwrap().gateway;
    let labels = gateway.metadata.unwrap().labels;
    let keys: Vec<&String> = labels.keys().collect();
    assert_eq!(keys, ["a1", "a2", "b"], "a change was lost");
    let stored = store.storage.get("shared").await.unwrap().unwrap();
    assert_eq!(stored.metadata.unwrap().labels, labels);
    store.stop().await;
}

/// Acknowledged means durable: the store's own connections commit with
/// SQLite `synchronous=FULL` and PostgreSQL `synchronous_commit=on`, even
/// when the database defaults to `off`; settings that would lose
/// acknowledged writes in a crash stop the store at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durability_is_enforced_on_the_stores_own_connections() {
    use gantry_store::storage::check_durability;
    let setting = |settings: &[(String, String)], name: &str| {
        settings.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()).unwrap_or_default()
    };
    let sqlite = TestDatabase::create(Backend::Sqlite).await.unwrap();
    let storage = gantry_store::open_storage(&sqlite.url).await.unwrap();
    let settings = storage.durability().await.unwrap();
    assert!(setting(&settings, "synchronous").parse::<i64>().unwrap() >= 2, "{settings:?}");
    assert_eq!(setting(&settings, "journal_mode"), "wal");

    if let Some(postgres) = TestDatabase::create(Backend::Postgres).await {
        use sqlx::Connection;
        let mut admin = sqlx::PgConnection::connect(&postgres.url).await.unwrap();
        let (name,): (String,) =
            sqlx::query_as("SELECT current_database()").fetch_one(&mut admin).await.unwrap();
        sqlx::query(&format!("ALTER DATABASE {name} SET synchronous_commit = off"))
            .execute(&mut admin)
            .await
            .unwrap();
        let storage = gantry_store::open_storage(&postgres.url).await.unwrap();
        let settings = storage.durability().await.unwrap();
        assert_eq!(setting(&settings, "synchronous_commit"), "on", "{settings:?}");
        assert_eq!(setting(&settings, "fsync"), "on", "{settings:?}");
    }

    let refused = |name: &str, value: &str| {
        check_durability(&[(name.to_string(), value.to_string())]).is_err()
    };
    assert!(refused("synchronous", "1") && refused("synchronous", "0"));
    assert!(refused("fsync", "off") && refused("synchronous_commit", "off"));
    assert!(!refused("synchronous", "2") && !refused("synchronous", "3"));
    assert!(!refused("synchronous_commit", "local") && !refused("fsync", "on"));
}
