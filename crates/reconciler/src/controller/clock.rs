//! Unix milliseconds and the status's timestamps, one way.

use prost_types::Timestamp;

pub(super) fn timestamp_ms(t: Option<&Timestamp>) -> u64 {
    t.map_or(0, |t| {
        let ms = t.seconds.saturating_mul(1000).saturating_add(i64::from(t.nanos / 1_000_000));
        u64::try_from(ms).unwrap_or(0)
    })
}

pub(super) fn ms_timestamp(ms: u64) -> Timestamp {
    Timestamp {
        seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
        nanos: i32::try_from((ms % 1000) * 1_000_000).unwrap_or(0),
    }
}
