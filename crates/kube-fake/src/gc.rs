//! Deletion and garbage collection: propagation policies (Background,
//! Foreground, Orphan), finalizers, a namespace's contents, and the
//! dependents of deleted owners.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::resources::ResourceType;
use crate::state::{ObjectKey, State, Stored, Written};
use crate::util::now_rfc3339;

impl State {
    /// Deletes with optional preconditions and a propagation policy
    /// (Background default, Foreground, Orphan).
    pub fn delete(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        options: &Value,
        policy: &str,
    ) -> Written {
        let (key, old) = self.existing(rt, namespace, name)?;
        Self::check_preconditions(
            &old.value,
            options["preconditions"]["resourceVersion"].as_str(),
            options["preconditions"]["uid"].as_str(),
        )?;
        let mut new = old.clone();
        let meta = &mut new.value["metadata"];
        let already = meta.get("deletionTimestamp").is_some();
        if !already {
            meta["deletionTimestamp"] = json!(now_rfc3339());
            meta["deletionGracePeriodSeconds"] = json!(0);
        }
        let mut finalizers: Vec<Value> = meta["finalizers"].as_array().cloned().unwrap_or_default();
        let uid = meta["uid"].as_str().unwrap_or("").to_string();
        let policy = if policy.is_empty() {
            options["propagationPolicy"].as_str().unwrap_or("Background")
        } else {
            policy
        };
        if policy == "Foreground" && !already && self.has_dependents(&uid) {
            finalizers.push(json!("foregroundDeletion"));
        }
        if policy == "Orphan" {
            self.orphan_dependents(&uid);
        }
        meta["finalizers"] = Value::Array(finalizers.clone());
        if finalizers.is_empty() {
            if let Some(m) = new.value["metadata"].as_object_mut() {
                m.remove("finalizers");
            }
        }
        if rt.kind == "Namespace" {
            self.delete_namespace_contents(name);
        }
        let rendered = if already && new.value == old.value {
            Self::render(&old)
        } else if finalizers.is_empty() {
            self.commit(&key, "DELETED", new, Some(old.value["metadata"]["labels"].clone()));
            // As the real server: an object removed at once is answered
            // with a Status; one that waits for finalizers, with itself.
            json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name, "group": rt.group, "kind": rt.plural, "uid": uid},
            })
        } else {
            self.commit(&key, "MODIFIED", new, Some(old.value["metadata"]["labels"].clone()))
        };
        self.collect_garbage();
        Ok(rendered)
    }

    fn delete_namespace_contents(&mut self, namespace: &str) {
        let keys: Vec<ObjectKey> =
            self.objects.keys().filter(|k| k.1 == namespace).cloned().collect();
        for key in keys {
            if let Some(stored) = self.objects.get(&key) {
                let labels = stored.labels.clone();
                let object = stored.load();
                self.commit(&key, "DELETED", object, Some(labels));
            }
        }
    }

    fn has_dependents(&self, uid: &str) -> bool {
        self.objects.values().any(|o| o.owners.iter().any(|u| u == uid))
    }

    fn orphan_dependents(&mut self, uid: &str) {
        let keys: Vec<ObjectKey> = self
            .objects
            .iter()
            .filter(|(_, o)| o.owners.iter().any(|u| u == uid))
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            let Some(old) = self.objects.get(&key).map(Stored::load) else { continue };
            let mut new = old.clone();
            if let Some(refs) = new.value["metadata"]["ownerReferences"].as_array_mut() {
                refs.retain(|r| r["uid"].as_str() != Some(uid));
            }
            self.commit(&key, "MODIFIED", new, Some(old.value["metadata"]["labels"].clone()));
        }
    }

    /// Deletes dependents whose owners are gone or being deleted in the
    /// foreground, and finishes foreground deletions with no dependents.
    pub fn collect_garbage(&mut self) {
        loop {
            let live_uids: BTreeSet<&str> = self
                .objects
                .values()
                .filter(|o| !o.foreground_deleting)
                .map(|o| o.uid.as_str())
                .collect();
            let orphan = self.objects.iter().find(|(_, o)| {
                !o.owners.is_empty()
                    && o.owners.iter().all(|u| !live_uids.contains(u.as_str()))
                    && !o.deleting
            });
            if let Some((key, stored)) = orphan.map(|(k, s)| (k.clone(), s.clone())) {
                let mut new = stored.load();
                new.value["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
                let labels = stored.labels.clone();
                let finalizers =
                    new.value["metadata"]["finalizers"].as_array().is_some_and(|f| !f.is_empty());
                self.commit(
                    &key,
                    if finalizers { "MODIFIED" } else { "DELETED" },
                    new,
                    Some(labels),
                );
                continue;
            }
            let finished = self
                .objects
                .iter()
                .find(|(_, o)| o.foreground_deleting && !self.has_dependents(&o.uid));
            if let Some((key, stored)) = finished.map(|(k, s)| (k.clone(), s.clone())) {
                let mut new = stored.load();
                if let Some(f) = new.value["metadata"]["finalizers"].as_array_mut() {
                    f.retain(|f| f != "foregroundDeletion");
                }
                let empty =
                    new.value["metadata"]["finalizers"].as_array().is_none_or(Vec::is_empty);
                let labels = stored.labels.clone();
                self.commit(&key, if empty { "DELETED" } else { "MODIFIED" }, new, Some(labels));
                continue;
            }
            return;
        }
    }
}
