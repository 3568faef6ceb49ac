//! Which events a subscriber sees: a label selector and an optional name,
//! with objects entering and leaving the selection as ADDED and DELETED.

use std::collections::BTreeMap;

use gantry_api::v1::EventType;
use gantry_core::Selector;

use crate::storage::{Event, Stored};

/// Which events a subscriber wants.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    selector: Selector,
    name: Option<String>,
}

impl Filter {
    /// Gateways matching `selector`, and named `name` when given (both
    /// checked by the caller).
    pub fn new(selector: Selector, name: Option<String>) -> Filter {
        Filter { selector, name }
    }

    fn matches_labels(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        static EMPTY: BTreeMap<String, String> = BTreeMap::new();
        self.selector.matches(labels.unwrap_or(&EMPTY))
    }

    /// Whether a stored object is in the watched set.
    pub fn matches(&self, gateway: &Stored) -> bool {
        self.name.as_deref().is_none_or(|n| n == gateway.name)
            && self.matches_labels(Some(&gateway.labels))
    }

    /// What a subscriber sees of an event: an object entering the selected
    /// set is ADDED, one leaving it is DELETED, one outside it is nothing.
    pub fn apply(&self, event: &Event) -> Option<EventType> {
        if self.name.as_deref().is_some_and(|n| n != event.name()) {
            return None;
        }
        let now = self.matches_labels(event.labels());
        let before = event.prev_labels.as_ref().is_some_and(|l| self.matches_labels(Some(l)));
        match (event.kind, before, now) {
            (EventType::Added, _, true) => Some(EventType::Added),
            (EventType::Modified, true, true) => Some(EventType::Modified),
            (EventType::Modified, false, true) => Some(EventType::Added),
            (EventType::Modified, true, false) => Some(EventType::Deleted),
            (EventType::Deleted, b, n) if b || n => Some(EventType::Deleted),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_api::v1::{Gateway, ObjectMeta};

    fn event(
        kind: EventType,
        name: &str,
        labels: &[(&str, &str)],
        prev: Option<&[(&str, &str)]>,
    ) -> Event {
        let map =
            |l: &[(&str, &str)]| l.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let gateway = Gateway {
            metadata: Some(ObjectMeta {
                name: name.into(),
                labels: map(labels),
                ..Default::default()
            }),
            ..Default::default()
        };
        Event::new(5, kind, &gateway, prev.map(map), Default::default())
    }

    fn filter(selector: &str, name: &str) -> Filter {
        let name = (!name.is_empty()).then(|| name.to_string());
        Filter::new(Selector::parse(selector).unwrap(), name)
    }

    #[test]
    fn objects_entering_and_leaving_the_selection() {
        let f = filter("env=prod", "");
        let prod: &[(&str, &str)] = &[("env", "prod")];
        let dev: &[(&str, &str)] = &[("env", "dev")];
        assert_eq!(f.apply(&event(EventType::Added, "a", prod, None)), Some(EventType::Added));
        assert_eq!(f.apply(&event(EventType::Added, "a", dev, None)), None);
        assert_eq!(
            f.apply(&event(EventType::Modified, "a", prod, Some(prod))),
            Some(EventType::Modified)
        );
        assert_eq!(
            f.apply(&event(EventType::Modified, "a", prod, Some(dev))),
            Some(EventType::Added)
        );
        assert_eq!(
            f.apply(&event(EventType::Modified, "a", dev, Some(prod))),
            Some(EventType::Deleted)
        );
        assert_eq!(f.apply(&event(EventType::Modified, "a", dev, Some(dev))), None);
        assert_eq!(
            f.apply(&event(EventType::Deleted, "a", prod, Some(prod))),
            Some(EventType::Deleted)
        );
        assert_eq!(f.apply(&event(EventType::Deleted, "a", dev, Some(dev))), None);
    }

    #[test]
    fn name_filter() {
        let f = filter("", "edge");
        assert_eq!(f.apply(&event(EventType::Added, "edge", &[], None)), Some(EventType::Added));
        assert_eq!(f.apply(&event(EventType::Added, "other", &[], None)), None);
    }
}
