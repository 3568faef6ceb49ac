//! Any accepted Gateway rendered into Kubernetes manifests: no panic, every
//! manifest names itself and its kind, and rendering is deterministic (the
//! fingerprint that decides whether to apply does not flap).
#![no_main]

use gantry_api::v1::Gateway;
use gantry_core::{lifecycle, Role, Write};
use gantry_reconciler::render::{render, RenderSettings};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(request) = Gateway::decode(data) else { return };
    let now = prost_types::Timestamp { seconds: 1_700_000_000, nanos: 0 };
    let Ok(Write::Put(gateway)) =
        lifecycle::create(None, request, Role::Admin, "uid".into(), now)
    else {
        return;
    };
    let settings = RenderSettings::default();
    let first = render(&gateway, &settings);
    for manifest in &first.objects {
        assert!(!manifest.kind.is_empty() && !manifest.name.is_empty());
        assert!(manifest.body["kind"] == manifest.kind);
    }
    assert_eq!(render(&gateway, &settings).fingerprint, first.fingerprint);
});
