//! The rows a PostgreSQL store's writer last read or wrote, as of the
//! revision of its last commit. They are current for as long as no other
//! writer (another replica) has committed since, and a batch's write checks
//! exactly that: it moves the revision only if it is still the one the
//! batch planned on (`postgres.rs`). So a batch whose rows are all known
//! plans on them and skips its read (one round trip instead of two); if
//! another writer came first, its compare-and-set fails, nothing is
//! written, these rows are forgotten, and the batch runs again on a read.
//!
//! A batch whose rules change nothing is not answered from here: with
//! nothing written nothing is checked, so it is answered from a read.

use std::collections::HashMap;

use gantry_api::v1::Gateway;

use super::{BatchPlan, StoredRow};

/// Rows kept at most; past it they are all forgotten (the next batches
/// read theirs again).
pub(crate) const KNOWN_ROWS: usize = 4096;

/// Rows by name (`None`: no such row) as of `revision`.
#[derive(Debug, Default)]
pub(crate) struct KnownRows {
    revision: Option<i64>,
    rows: HashMap<String, Option<Gateway>>,
}

impl KnownRows {
    /// The revision and the rows of `names` (as a batch reads them), when
    /// every one is known.
    pub fn lookup(&self, names: &[String]) -> Option<(i64, HashMap<String, StoredRow>)> {
        let revision = self.revision?;
        let mut stored = HashMap::with_capacity(names.len());
        for name in names {
            if let Some(gateway) = self.rows.get(name)? {
                stored.insert(name.clone(), Ok(gateway.clone()));
            }
        }
        Some((revision, stored))
    }

    /// `plan`, made on `stored` as of `base` for the rows of `names`, is
    /// committed: each row as the plan left it, as of the plan's revision.
    /// Rows known from before are kept only if `base` is the revision they
    /// are known at (nobody else committed in between).
    pub fn committed(
        &mut self,
        base: i64,
        stored: &HashMap<String, StoredRow>,
        names: &[String],
        plan: &BatchPlan,
    ) {
        if self.revision != Some(base) {
            self.rows.clear();
        }
        let changed: HashMap<&str, Option<&Gateway>> = plan
            .rows
            .iter()
            .map(|row| (row.name.as_str(), plan.after(row).map(|(gateway, _)| gateway)))
            .collect();
        for name in names {
            let state = match (changed.get(name.as_str()), stored.get(name)) {
                (Some(after), _) => after.cloned(),
                // A row that does not decode is not kept.
                (None, Some(Err(_))) => {
                    self.rows.remove(name);
                    continue;
                }
                (None, Some(Ok(gateway))) => Some(gateway.clone()),
                // Absent, or made and removed within the batch.
                (None, None) => None,
            };
            self.rows.insert(name.clone(), state);
        }
        if self.rows.len() > KNOWN_ROWS {
            self.rows.clear();
        }
        self.revision = Some(plan.revision);
    }

    /// Forgets every row: another writer may have committed, or the last
    /// commit's outcome is unknown.
    pub fn forget(&mut self) {
        self.revision = None;
        self.rows.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::plan_batch;
    use crate::storage::test_writes::{named, put, remove};

    fn image(stored: &HashMap<String, StoredRow>, name: &str) -> Option<String> {
        stored.get(name).map(|g| g.as_ref().unwrap().spec.as_ref().unwrap().image.clone())
    }

    #[test]
    fn rows_are_known_as_the_last_commit_left_them_and_only_at_its_revision() {
        let mut known = KnownRows::default();
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(known.lookup(&names(&["a"])).is_none(), "nothing known yet");
        // Read at 10: a exists, b does not; the batch changes a, makes c.
        let stored = HashMap::from([("a".to_string(), Ok(named("a", "v1")))]);
        let batch = [put("a", "v2"), put("c", "v1")];
        let plan = plan_batch(&stored, &batch, 10);
        known.committed(10, &stored, &names(&["a", "b", "c"]), &plan);
        let (revision, rows) = known.lookup(&names(&["a", "b", "c"])).unwrap();
        assert_eq!(revision, 12);
        assert_eq!((image(&rows, "a"), image(&rows, "c")), (Some("v2".into()), Some("v1".into())));
        assert!(!rows.contains_key("b"), "b is known to be absent");
        assert!(known.lookup(&names(&["a", "d"])).is_none(), "d is not known");

        // The next batch, planned on them at 12, removes c.
        let (base, stored) = known.lookup(&names(&["c"])).unwrap();
        let plan = plan_batch(&stored, &[remove("c")], base);
        known.committed(base, &stored, &names(&["c"]), &plan);
        let (revision, rows) = known.lookup(&names(&["a", "c"])).unwrap();
        assert_eq!(
            (revision, image(&rows, "a"), rows.contains_key("c")),
            (13, Some("v2".into()), false)
        );

        // A batch read at 20 (another writer committed 14..=20): what was
        // known before is forgotten, only its own rows are known.
        let stored = HashMap::from([("x".to_string(), Ok(named("x", "v1")))]);
        let plan = plan_batch(&stored, &[put("x", "v2")], 20);
        known.committed(20, &stored, &names(&["x"]), &plan);
        assert!(known.lookup(&names(&["a"])).is_none(), "a may have changed at 14..=20");
        assert_eq!(known.lookup(&names(&["x"])).unwrap().0, 21);

        known.forget();
        assert!(known.lookup(&names(&["x"])).is_none());
    }
}
