//! Syntax of the names and values a Gateway carries, as Kubernetes and the
//! OCI distribution spec define them. Each check returns `Err(description)`
//! with what a valid value looks like.

/// Longest object name: an RFC 1123 label.
pub const MAX_NAME_LEN: usize = 63;

type Check = Result<(), String>;

fn is_alnum_lower(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// An RFC 1123 label: lowercase alphanumerics and '-', starting and ending
/// with an alphanumeric, at most 63 characters.
pub fn dns1123_label(s: &str) -> Check {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| is_alnum_lower(c) || c == '-')
        && s.starts_with(is_alnum_lower)
        && s.ends_with(is_alnum_lower);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{s:?} is not an RFC 1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters"
        ))
    }
}

/// An RFC 1035 label: an RFC 1123 label that starts with a letter. Service
/// names must be one, and gantry names a gateway's Service after it.
pub fn dns1035_label(s: &str) -> Check {
    if dns1123_label(s).is_ok() && s.starts_with(|c: char| c.is_ascii_lowercase()) {
        Ok(())
    } else {
        Err(format!(
            "{s:?} is not an RFC 1035 label: lowercase letters, digits and '-', starting with a letter and ending with a letter or digit, at most 63 characters"
        ))
    }
}

/// An RFC 1123 subdomain: dot-separated labels, at most 253 characters.
pub fn dns1123_subdomain(s: &str) -> Check {
    let ok = !s.is_empty() && s.len() <= 253 && s.split('.').all(|l| dns1123_label(l).is_ok());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{s:?} is not an RFC 1123 DNS name: dot-separated lowercase labels of letters, digits and '-', at most 253 characters"
        ))
    }
}

/// A DNS name a certificate may cover: a subdomain, optionally `*.` first.
pub fn server_dns_name(s: &str) -> Check {
    let rest = s.strip_prefix("*.").unwrap_or(s);
    dns1123_subdomain(rest).map_err(|_| {
        format!("{s:?} is not a DNS name: lowercase RFC 1123 subdomain, optionally starting with \"*.\"")
    })
}

fn qualified_name_part(s: &str) -> bool {
    let edge = |c: char| c.is_ascii_alphanumeric();
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(edge)
        && s.ends_with(edge)
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A Kubernetes qualified name, the syntax of label and annotation keys and
/// finalizers: an optional DNS-subdomain prefix and '/', then a name of at
/// most 63 alphanumerics, '-', '_' or '.'.
pub fn qualified_name(s: &str) -> Check {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let prefix_ok = prefix.is_none_or(|p| dns1123_subdomain(p).is_ok());
    if prefix_ok && qualified_name_part(name) {
        Ok(())
    } else {
        Err(format!(
            "{s:?} is not a qualified name: an optional DNS prefix and '/', then at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        ))
    }
}

/// A label value: empty, or at most 63 alphanumerics, '-', '_' or '.',
/// starting and ending with an alphanumeric.
pub fn label_value(s: &str) -> Check {
    if s.is_empty() || qualified_name_part(s) {
        Ok(())
    } else {
        Err(format!(
            "{s:?} is not a label value: empty, or at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        ))
    }
}

/// A ConfigMap key: at most 253 alphanumerics, '-', '_' or '.', not "." or "..".
pub fn config_key(s: &str) -> Check {
    let ok = !s.is_empty()
        && s.len() <= 253
        && s != "."
        && s != ".."
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!("{s:?} is not a config key: at most 253 letters, digits, '-', '_' or '.'"))
    }
}

fn path_component(s: &str) -> bool {
    // [a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*
    let bytes = s.as_bytes();
    if bytes.is_empty() || !is_alnum_lower(bytes[0] as char) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i] as char;
        if is_alnum_lower(c) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && matches!(bytes[i], b'.' | b'_' | b'-') {
            i += 1;
        }
        let sep = &s[start..i];
        let sep_ok = sep == "." || sep == "_" || sep == "__" || sep.chars().all(|c| c == '-');
        if !sep_ok || i == bytes.len() || !is_alnum_lower(bytes[i] as char) {
            return false;
        }
    }
    true
}

fn registry_host(s: &str) -> bool {
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    };
    let host_ok = !host.is_empty()
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    host_ok && port_ok
}

fn tag(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && (s.as_bytes()[0].is_ascii_alphanumeric() || s.starts_with('_'))
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn digest(s: &str) -> bool {
    let Some((algorithm, hex)) = s.split_once(':') else {
        return false;
    };
    let algorithm_ok = !algorithm.is_empty()
        && algorithm.chars().all(|c| is_alnum_lower(c) || matches!(c, '+' | '.' | '_' | '-'))
        && algorithm.starts_with(is_alnum_lower);
    algorithm_ok && hex.len() >= 32 && hex.chars().all(|c| c.is_ascii_hexdigit())
}

/// An OCI image reference: `[registry[:port]/]path[:tag][@algorithm:hex]`.
pub fn image_reference(s: &str) -> Check {
    let invalid = || {
        Err(format!(
            "{s:?} is not an image reference: [registry/]repository[:tag][@sha256:digest], lowercase repository"
        ))
    };
    if s.is_empty() || s.len() > 1024 {
        return invalid();
    }
    let (name_and_tag, digest_part) = match s.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (s, None),
    };
    if digest_part.is_some_and(|d| !digest(d)) {
        return invalid();
    }
    let last_slash = name_and_tag.rfind('/').map_or(0, |i| i + 1);
    let (name, tag_part) = match name_and_tag[last_slash..].rfind(':') {
        Some(i) => (&name_and_tag[..last_slash + i], Some(&name_and_tag[last_slash + i + 1..])),
        None => (name_and_tag, None),
    };
    if tag_part.is_some_and(|t| !tag(t)) || name.is_empty() || name.len() > 255 {
        return invalid();
    }
    let mut components: Vec<&str> = name.split('/').collect();
    if components.len() > 1 {
        let first = components[0];
        if first.contains('.') || first.contains(':') || first == "localhost" {
            if !registry_host(first) {
                return invalid();
            }
            components.remove(0);
        }
    }
    if components.iter().all(|c| path_component(c)) {
        Ok(())
    } else {
        invalid()
    }
}

/// An https URL with a host, no fragment and no whitespace.
pub fn https_url(s: &str) -> Check {
    let invalid = || {
        Err(format!("{s:?} is not an https URL such as \"https://issuer.example.com/realms/main\""))
    };
    let Some(rest) = s.strip_prefix("https://") else {
        return invalid();
    };
    if s.len() > 2048 || s.contains('#') || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return invalid();
    }
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.is_empty() || !registry_host(host) {
        return invalid();
    }
    Ok(())
}

/// A non-negative Kubernetes quantity such as "500m", "2", "1.5Gi" or "1e3".
pub fn quantity(s: &str) -> Check {
    let invalid = || Err(format!("{s:?} is not a quantity such as \"250m\", \"2\" or \"512Mi\""));
    let s_body = s.strip_prefix('+').unwrap_or(s);
    let number_end =
        s_body.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s_body.len());
    let (number, suffix) = s_body.split_at(number_end);
    let digits_ok = !number.is_empty()
        && number.matches('.').count() <= 1
        && number.chars().any(|c| c.is_ascii_digit());
    let suffix_ok = matches!(
        suffix,
        "" | "Ki"
            | "Mi"
            | "Gi"
            | "Ti"
            | "Pi"
            | "Ei"
            | "n"
            | "u"
            | "m"
            | "k"
            | "M"
            | "G"
            | "T"
            | "P"
            | "E"
    ) || suffix
        .strip_prefix(['e', 'E'])
        .map(|e| e.strip_prefix(['+', '-']).unwrap_or(e))
        .is_some_and(|e| !e.is_empty() && e.len() <= 3 && e.bytes().all(|b| b.is_ascii_digit()));
    if s.len() <= 64 && digits_ok && suffix_ok {
        Ok(())
    } else {
        invalid()
    }
}

/// The value of a quantity that [`quantity`] accepts, in billionths
/// (rounded up, as Kubernetes rounds to nano precision), saturating at
/// `i128::MAX`; `None` when it is not a quantity.
pub fn quantity_nanos(s: &str) -> Option<i128> {
    quantity(s).ok()?;
    let body = s.strip_prefix('+').unwrap_or(s);
    let end = body.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(body.len());
    let (number, suffix) = body.split_at(end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let (binary, mut exponent): (u32, i32) = match suffix {
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "" => (0, 0),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        e => (0, e[1..].parse().ok()?),
    };
    // digits * 10^(exponent - fraction digits + 9) * 2^binary
    exponent = exponent + 9 - i32::try_from(fraction.len()).ok()?;
    let mut value: i128 = 0;
    for d in whole.bytes().chain(fraction.bytes()) {
        value = match value.checked_mul(10).and_then(|v| v.checked_add(i128::from(d - b'0'))) {
            Some(v) => v,
            None => return Some(i128::MAX),
        };
    }
    value = value.checked_mul(1i128 << binary).unwrap_or(i128::MAX);
    if exponent >= 0 {
        Some(
            10i128
                .checked_pow(exponent.unsigned_abs())
                .and_then(|p| value.checked_mul(p))
                .map_or(if value == 0 { 0 } else { i128::MAX }, |v| v),
        )
    } else {
        Some(match 10i128.checked_pow(exponent.unsigned_abs()) {
            Some(p) => value / p + i128::from(value % p != 0),
            None => i128::from(value != 0),
        })
    }
}

/// One spelling per amount, for comparing and rendering quantities:
/// `0.25`, `250m` and `0.250` are all `250m`; `1024Mi` is `1Gi`; `1000` is
/// `1k`. Whole amounts take the largest binary suffix that divides them
/// exactly, else the largest decimal one; fractions are written in `m`,
/// `u` or `n`. Text that is not a quantity (or too large to count) comes
/// back as it is.
pub fn canonical_quantity(s: &str) -> String {
    const NANOS: i128 = 1_000_000_000;
    let Some(nanos) = quantity_nanos(s).filter(|n| *n != i128::MAX) else {
        return s.to_string();
    };
    if nanos % NANOS != 0 {
        for (suffix, per) in [("m", 1_000_000), ("u", 1_000), ("n", 1)] {
            if nanos % per == 0 {
                return format!("{}{suffix}", nanos / per);
            }
        }
    }
    let whole = nanos / NANOS;
    if whole == 0 {
        return "0".into();
    }
    for (suffix, shift) in [("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)]
    {
        if whole % (1i128 << shift) == 0 {
            return format!("{}{suffix}", whole >> shift);
        }
    }
    for (suffix, exponent) in [("E", 18), ("P", 15), ("T", 12), ("G", 9), ("M", 6), ("k", 3)] {
        let per = 10i128.pow(exponent);
        if whole % per == 0 {
            return format!("{}{suffix}", whole / per);
        }
    }
    whole.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quantity_has_one_canonical_spelling_per_amount() {
        for (written, canonical) in [
            ("0.25", "250m"),
            ("250m", "250m"),
            ("0.250", "250m"),
            ("1", "1"),
            ("1000m", "1"),
            ("1.5", "1500m"),
            ("1024Mi", "1Gi"),
            ("1Gi", "1Gi"),
            ("1.5Gi", "1536Mi"),
            ("1000", "1k"),
            ("1e3", "1k"),
            ("128974848", "123Mi"),
            ("0", "0"),
            ("100u", "100u"),
            ("not a quantity", "not a quantity"),
        ] {
            assert_eq!(canonical_quantity(written), canonical, "{written}");
            let again = canonical_quantity(canonical);
            assert_eq!(again, canonical, "idempotent for {written}");
            assert_eq!(
                quantity_nanos(canonical),
                quantity_nanos(written),
                "same amount: {written}"
            );
        }
    }

    #[test]
    fn labels_and_subdomains() {
        assert!(dns1123_label("edge-1").is_ok());
        assert!(dns1123_label(&"a".repeat(63)).is_ok());
        assert!(dns1123_label(&"a".repeat(64)).is_err());
        for bad in ["", "-a", "a-", "Edge", "a_b", "a.b", "é"] {
            assert!(dns1123_label(bad).is_err(), "{bad}");
        }
        assert!(dns1035_label("edge-1").is_ok());
        for bad in ["1edge", "0", "-a", "Edge", ""] {
            assert!(dns1035_label(bad).is_err(), "{bad}");
        }
        assert!(dns1123_subdomain("api.example.com").is_ok());
        assert!(dns1123_subdomain("api..example.com").is_err());
        assert!(server_dns_name("*.example.com").is_ok());
        assert!(server_dns_name("a.*.example.com").is_err());
    }

    #[test]
    fn qualified_names_and_values() {
        for good in ["app", "app.kubernetes.io/name", "gantry.dev/gateway", "A_b.c-d"] {
            assert!(qualified_name(good).is_ok(), "{good}");
        }
        for bad in ["", "/x", "a/", "Bad_Prefix/x", "x/y/z", "-x", &"a".repeat(64)] {
            assert!(qualified_name(bad).is_err(), "{bad}");
        }
        assert!(label_value("").is_ok());
        assert!(label_value("v1.2_3").is_ok());
        assert!(label_value("has space").is_err());
    }

    #[test]
    fn image_references() {
        for good in [
            "nginx",
            "nginx:1.27",
            "library/nginx:latest",
            "ghcr.io/gantry-dev/gateway:v1.2.3",
            "localhost:5000/gw",
            "registry.example.com:443/team/gw@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "gw:1.0@sha256:0123456789abcdef0123456789abcdef",
            "a__b/c---d",
        ] {
            assert!(image_reference(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "Nginx",
            "nginx:",
            "nginx:-x",
            "nginx@sha256:xyz",
            "a//b",
            "a_/b",
            "gw:1 0",
            "ex ample/x",
        ] {
            assert!(image_reference(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn urls_and_quantities() {
        assert!(https_url("https://issuer.example.com/realms/main").is_ok());
        assert!(https_url("https://issuer.example.com:8443").is_ok());
        for bad in
            ["http://issuer.example.com", "https://", "https:// x", "https://a.com/#f", "issuer"]
        {
            assert!(https_url(bad).is_err(), "{bad}");
        }
        for good in ["1", "250m", "1.5Gi", "512Mi", "1e3", "0.5", "+2"] {
            assert!(quantity(good).is_ok(), "{good}");
        }
        for bad in ["", "-1", "1.2.3", "Mi", "1x", "1 Gi"] {
            assert!(quantity(bad).is_err(), "{bad}");
        }
        assert!(config_key("app.yaml").is_ok());
        assert!(config_key("..").is_err());
        assert!(config_key("a/b").is_err());
    }

    #[test]
    fn quantities_compare_by_value() {
        let n = |s: &str| quantity_nanos(s).unwrap();
        assert_eq!(n("100m"), n("0.1"));
        assert_eq!(n("1Gi"), n("1073741824"));
        assert_eq!(n("1k"), n("1e3"));
        assert_eq!(n("1500m"), n("1.5"));
        assert_eq!(n("1n"), 1);
        assert_eq!(n("1e-12"), 1, "rounded up to nano precision");
        assert!(n("129Mi") > n("128M"));
        assert!(n("250m") < n("1"));
        assert_eq!(n("0"), 0);
        assert_eq!(n("1e999"), i128::MAX);
        assert_eq!(quantity_nanos("lots"), None);
    }
}
