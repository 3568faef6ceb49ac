//! The canonical form of a spec, which decides whether `generation` advances
//! (rule 2): the decoded message, set-like lists sorted and deduplicated and
//! empty sub-messages dropped. Maps are `BTreeMap`s, so key order never
//! counts. `replicas` left unset stays unset: it means "not managed by
//! gantry" (an autoscaler or `kubectl scale` decides, starting from
//! Kubernetes' default of 1), which is not the same as a fixed 1.

use gantry_api::v1::GatewaySpec;

use crate::syntax::canonical_quantity;

fn sort_dedup(list: &mut Vec<String>) {
    list.sort();
    list.dedup();
}

/// Returns the canonical form of `spec`. Idempotent.
pub fn canonical_spec(mut spec: GatewaySpec) -> GatewaySpec {
    sort_dedup(&mut spec.server_dns_names);
    if let Some(oidc) = &mut spec.oidc {
        sort_dedup(&mut oidc.audiences);
    }
    if spec.route.as_ref().is_some_and(|r| *r == Default::default()) {
        spec.route = None;
    }
    if spec.oidc.as_ref().is_some_and(|o| *o == Default::default()) {
        spec.oidc = None;
    }
    if spec.resources.as_ref().is_some_and(|r| r.requests.is_empty() && r.limits.is_empty()) {
        spec.resources = None;
    }
    spec
}

/// Whether two specs differ after canonicalisation: the generation rule.
/// Quantities compare by amount (`0.25` and `250m` are one spec), but the
/// stored spec keeps them as the user wrote them: a rewrite to the same
/// amount changes nothing, and the reconciler renders every quantity in
/// one spelling ([`canonical_quantity`]), so its pods never roll for it.
pub fn spec_changed(old: &GatewaySpec, new: &GatewaySpec) -> bool {
    comparable(old.clone()) != comparable(new.clone())
}

/// The canonical form with every quantity in its canonical spelling.
fn comparable(spec: GatewaySpec) -> GatewaySpec {
    let mut spec = canonical_spec(spec);
    if let Some(resources) = &mut spec.resources {
        for value in resources.requests.values_mut().chain(resources.limits.values_mut()) {
            *value = canonical_quantity(value);
        }
    }
    spec
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_api::v1::{Oidc, Route};

    #[test]
    fn order_duplicates_and_defaults_do_not_count() {
        let a = GatewaySpec {
            image: "gw".into(),
            server_dns_names: vec![
                "b.example.com".into(),
                "a.example.com".into(),
                "a.example.com".into(),
            ],
            oidc: Some(Oidc {
                issuer_url: "https://i".into(),
                client_id: "c".into(),
                audiences: vec!["y".into(), "x".into()],
            }),
            route: Some(Route::default()),
            ..Default::default()
        };
        let b = GatewaySpec {
            image: "gw".into(),
            server_dns_names: vec!["a.example.com".into(), "b.example.com".into()],
            oidc: Some(Oidc {
                issuer_url: "https://i".into(),
                client_id: "c".into(),
                audiences: vec!["x".into(), "y".into()],
            }),
            ..Default::default()
        };
        assert!(!spec_changed(&a, &b));
        assert_eq!(canonical_spec(a.clone()), canonical_spec(canonical_spec(a)));
    }

    #[test]
    fn a_quantity_counts_by_its_amount_not_its_spelling() {
        let cpu = |q: &str| GatewaySpec {
            image: "gw".into(),
            resources: Some(gantry_api::v1::ResourceRequirements {
                requests: [("cpu".to_string(), q.to_string())].into(),
                limits: [("memory".to_string(), "1Gi".to_string())].into(),
            }),
            ..Default::default()
        };
        assert!(!spec_changed(&cpu("0.25"), &cpu("250m")));
        assert!(spec_changed(&cpu("0.25"), &cpu("251m")));
        // What the user wrote is kept.
        let kept = canonical_spec(cpu("0.25")).resources.unwrap();
        assert_eq!(kept.requests["cpu"], "0.25");
    }

    #[test]
    fn every_field_counts() {
        let base = canonical_spec(GatewaySpec { image: "gw".into(), ..Default::default() });
        let changes: Vec<fn(&mut GatewaySpec)> = vec![
            |s| s.image = "gw2".into(),
            |s| s.supervisor_image = "sup".into(),
            |s| s.replicas = Some(0),
            |s| s.replicas = Some(1),
            |s| s.route = Some(Route { host: "h".into(), ..Default::default() }),
            |s| s.server_dns_names.push("a".into()),
            |s| s.oidc = Some(Oidc { client_id: "c".into(), ..Default::default() }),
            |s| s.credential_driver = "vault".into(),
            |s| {
                s.config.insert("k".into(), "v".into());
            },
            |s| {
                s.resources = Some(gantry_api::v1::ResourceRequirements {
                    requests: [("cpu".to_string(), "1".to_string())].into(),
                    ..Default::default()
                })
            },
        ];
        for change in changes {
            let mut changed = base.clone();
            change(&mut changed);
            assert!(spec_changed(&base, &changed), "{changed:?}");
        }
    }
}
