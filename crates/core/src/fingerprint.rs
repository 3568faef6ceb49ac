//! A stable fingerprint of bytes (64-bit FNV-1a, hex): the same rendered
//! deployment inputs give the same fingerprint on every build and machine.

/// FNV-1a 64 of `bytes`, as 16 hex digits.
pub fn fingerprint(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(fingerprint(b""), "cbf29ce484222325");
        assert_eq!(fingerprint(b"a"), "af63dc4c8601ec8c");
        assert_ne!(fingerprint(b"ab"), fingerprint(b"ba"));
    }
}
