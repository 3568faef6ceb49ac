//! A storage that runs every call through the one the store would open,
//! and hands each batch's outcome to a hook: tests observe where batches
//! run, or change what the writer is told (a commit whose answer is lost).

use std::sync::Arc;

use gantry_api::v1::Gateway;
use gantry_store::storage::{
    Committed, Event, Page, PendingWrite, Retention, Snapshot, Storage, StorageError,
};

/// A batch's outcome.
pub type Outcome = Result<Vec<Result<Committed, StorageError>>, StorageError>;

/// Called after each batch with the storage's role (`"main"`, `"writer"`
/// for the one [`Storage::for_writer`] gave, `"background"`), the names the
/// batch wrote and its outcome; answers the outcome the caller gets.
pub type AfterBatch = Arc<dyn Fn(&'static str, &[String], Outcome) -> Outcome + Send + Sync>;

pub struct Hooked {
    inner: Arc<dyn Storage>,
    role: &'static str,
    after: AfterBatch,
}

impl Hooked {
    /// What [`super::TestStore::start_wrapped`] takes: the store's storage
    /// with `after` called after each batch.
    pub fn wrap(after: AfterBatch) -> impl FnOnce(Arc<dyn Storage>) -> Arc<dyn Storage> {
        move |inner| Arc::new(Hooked { inner, role: "main", after })
    }
}

impl std::fmt::Debug for Hooked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooked").field("inner", &self.inner).field("role", &self.role).finish()
    }
}

#[tonic::async_trait]
impl Storage for Hooked {
    async fn get(&self, name: &str) -> Result<Option<Gateway>, StorageError> {
        self.inner.get(name).await
    }
    async fn list(&self, page: Page<'_>) -> Result<Snapshot, StorageError> {
        self.inner.list(page).await
    }
    fn for_background(&self) -> Arc<dyn Storage> {
        let inner = self.inner.for_background();
        Arc::new(Hooked { inner, role: "background", after: self.after.clone() })
    }
    fn for_writer(&self) -> Arc<dyn Storage> {
        let inner = self.inner.for_writer();
        Arc::new(Hooked { inner, role: "writer", after: self.after.clone() })
    }
    fn page_token_key(&self) -> &[u8] {
        self.inner.page_token_key()
    }
    async fn write_batch(&self, writes: Vec<PendingWrite>) -> Outcome {
        let names: Vec<String> = writes.iter().map(|w| w.name.clone()).collect();
        let outcome = self.inner.write_batch(writes).await;
        (self.after)(self.role, &names, outcome)
    }
    async fn events_after(
        &self,
        after: i64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Arc<Event>>, StorageError> {
        self.inner.events_after(after, limit, max_bytes).await
    }
    async fn current_revision(&self) -> Result<i64, StorageError> {
        self.inner.current_revision().await
    }
    async fn compact(&self, retention: Retention) -> Result<i64, StorageError> {
        self.inner.compact(retention).await
    }
    async fn listen_for_commits(
        &self,
        committed: &(dyn Fn(Option<i64>) + Send + Sync),
    ) -> Result<(), StorageError> {
        self.inner.listen_for_commits(committed).await
    }
    async fn durability(&self) -> Result<Vec<(String, String)>, StorageError> {
        self.inner.durability().await
    }
    async fn ping(&self) -> Result<(), StorageError> {
        self.inner.ping().await
    }
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
}
