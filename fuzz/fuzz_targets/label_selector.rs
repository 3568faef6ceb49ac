//! Any string as a label selector: no panic, and a parsed selector can be
//! evaluated on labels taken from the same input.
#![no_main]

use std::collections::BTreeMap;

use gantry_core::Selector;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(selector) = Selector::parse(text) else { return };
    let labels: BTreeMap<String, String> = text
        .split(',')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let _ = selector.matches(&labels);
    let _ = selector.matches(&BTreeMap::new());
});
