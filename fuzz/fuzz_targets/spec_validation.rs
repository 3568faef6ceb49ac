//! Any bytes, decoded as a Gateway, through the create rules: no panic, and
//! whatever is accepted is stored canonical (creating it again from its
//! own stored form gives the same spec).
#![no_main]

use gantry_api::v1::Gateway;
use gantry_core::{lifecycle, Role, Write};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(request) = Gateway::decode(data) else { return };
    let now = prost_types::Timestamp { seconds: 1_700_000_000, nanos: 0 };
    let Ok(Write::Put(stored)) = lifecycle::create(None, request, Role::Admin, "uid".into(), now)
    else {
        return;
    };
    assert_eq!(stored.metadata.as_ref().map(|m| m.generation), Some(1));
    let again = Gateway { status: None, ..stored.clone() };
    match lifecycle::create(None, again, Role::Admin, "uid".into(), now) {
        Ok(Write::Put(second)) => assert_eq!(second.spec, stored.spec, "canonical form moved"),
        other => panic!("a stored gateway does not validate again: {other:?}"),
    }
});
