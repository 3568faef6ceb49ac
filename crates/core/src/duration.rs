//! Human durations for flags: `250us`, `500ms`, `30s`, `5m`, `1h`, `1h30m`.

use std::time::Duration;

/// Parses a duration made of `<number><unit>` parts, units `us` (or `µs`),
/// `ms`, `s`, `m`, `h`, `d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let invalid = || format!("{text:?} is not a duration such as 500ms, 30s, 5m or 1h30m");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(invalid());
    }
    // Zero needs no unit, as in Go's durations (kubectl's flags).
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(invalid)?;
        if digits == 0 {
            return Err(invalid());
        }
        let value: u64 = rest[..digits].parse().map_err(|_| invalid())?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let part = match &rest[..unit_len] {
            "us" | "µs" => Duration::from_micros(value),
            "ms" => Duration::from_millis(value),
            "s" => Duration::from_secs(value),
            "m" => Duration::from_secs(value.saturating_mul(60)),
            "h" => Duration::from_secs(value.saturating_mul(3600)),
            "d" => Duration::from_secs(value.saturating_mul(86_400)),
            _ => return Err(invalid()),
        };
        total = total.saturating_add(part);
        rest = &rest[unit_len..];
    }
    Ok(total)
}

/// [`parse_duration`] for a period, which cannot be zero.
pub fn parse_period(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        Duration::ZERO => Err(format!("{text:?}: a period must be above zero")),
        period => Ok(period),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_sums() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("1ms250µs"), Ok(Duration::from_micros(1250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        for bad in ["", "10", "00", "s", "1x", "-1s", "1.5s", "1 s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(super::parse_period("10s"), Ok(Duration::from_secs(10)));
        assert!(super::parse_period("0").is_err() && super::parse_period("0ms").is_err());
    }
}
