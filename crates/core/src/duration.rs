//! Human durations for flags: `500ms`, `30s`, `5m`, `1h`, `1h30m`.

use std::time::Duration;

/// Parses a duration made of `<number><unit>` parts, units `ms`, `s`, `m`,
/// `h`, `d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let invalid = || format!("{text:?} is not a duration such as 500ms, 30s, 5m or 1h30m");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(invalid());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_sums() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        for bad in ["", "10", "s", "1x", "-1s", "1.5s", "1 s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
