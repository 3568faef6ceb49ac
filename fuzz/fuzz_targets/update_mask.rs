//! Any update mask (comma-separated paths) and any incoming Gateway, from
//! any role, against a valid stored gateway: no panic, and an accepted
//! update never moves the generation backwards nor by more than one.
#![no_main]

use gantry_api::v1::{Gateway, GatewaySpec, ObjectMeta};
use gantry_core::{lifecycle, Role, Write};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let split = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
    let (mask, message) = rest.split_at(split);
    let Ok(mask) = std::str::from_utf8(mask) else { return };
    let mask: Vec<String> = mask.split(',').map(str::to_string).collect();
    let incoming = Gateway::decode(message.get(1..).unwrap_or_default()).unwrap_or_default();
    let role = Role::ALL[usize::from(selector) % Role::ALL.len()];
    let now = prost_types::Timestamp { seconds: 1_700_000_000, nanos: 0 };
    let request = Gateway {
        metadata: Some(ObjectMeta { name: "edge".into(), ..Default::default() }),
        spec: Some(GatewaySpec { image: "ghcr.io/acme/gw:1".into(), ..Default::default() }),
        status: None,
    };
    let Ok(Write::Put(current)) =
        lifecycle::create(None, request, Role::Admin, "uid".into(), now)
    else {
        panic!("the seed gateway must be valid");
    };
    let generation = |g: &Gateway| g.metadata.as_ref().map_or(0, |m| m.generation);
    if let Ok(Write::Put(next) | Write::Unchanged(next)) =
        lifecycle::update(&current, &incoming, &mask, role, now)
    {
        let (before, after) = (generation(&current), generation(&next));
        assert!(after == before || after == before + 1, "generation {before} -> {after}");
    }
});
