//! A tar writer that gives the same bytes for the same entries: ustar
//! headers with fixed times and owners given by the caller, entries in
//! path order, no user or group names.

use std::collections::BTreeMap;

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File(Vec<u8>),
}

/// One entry: its kind, mode bits and owner (uid = gid).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    pub mode: u32,
    pub owner: u32,
}

/// Entries by path (relative, no leading `/`); directories end up before
/// what they hold because their paths sort first.
#[derive(Debug, Default)]
pub struct Tree(BTreeMap<String, Entry>);

impl Tree {
    /// Adds a directory (and its parents, root-owned 0755).
    pub fn dir(&mut self, path: &str, mode: u32, owner: u32) {
        self.parents(path);
        self.0.insert(path.trim_matches('/').to_string(), Entry { kind: Kind::Dir, mode, owner });
    }

    /// Adds a file (and its parents).
    pub fn file(&mut self, path: &str, mode: u32, owner: u32, data: Vec<u8>) {
        self.parents(path);
        let entry = Entry { kind: Kind::File(data), mode, owner };
        self.0.insert(path.trim_matches('/').to_string(), entry);
    }

    fn parents(&mut self, path: &str) {
        let path = path.trim_matches('/');
        let mut at = 0;
        while let Some(slash) = path[at..].find('/') {
            let parent = &path[..at + slash];
            self.0.entry(parent.to_string()).or_insert(Entry {
                kind: Kind::Dir,
                mode: 0o755,
                owner: 0,
            });
            at += slash + 1;
        }
    }

    /// The tar archive, every entry dated `mtime`.
    pub fn archive(&self, mtime: u64) -> anyhow::Result<Vec<u8>> {
        let mut out = Vec::new();
        for (path, entry) in &self.0 {
            let (name, size, kind) = match &entry.kind {
                Kind::Dir => (format!("{path}/"), 0, b'5'),
                Kind::File(data) => (path.clone(), data.len(), b'0'),
            };
            out.extend_from_slice(&header(&name, entry.mode, entry.owner, size, mtime, kind)?);
            if let Kind::File(data) = &entry.kind {
                out.extend_from_slice(data);
                out.resize(out.len().next_multiple_of(512), 0);
            }
        }
        out.resize(out.len() + 1024, 0);
        Ok(out)
    }
}

/// One ustar header block.
fn header(
    name: &str,
    mode: u32,
    owner: u32,
    size: usize,
    mtime: u64,
    kind: u8,
) -> anyhow::Result<[u8; 512]> {
    let mut h = [0u8; 512];
    let (prefix, name) = match name.len() {
        0..=100 => ("", name),
        _ => {
            let split =
                name[..name.len().min(155)].rfind('/').filter(|s| name.len() - s - 1 <= 100);
            let split = split.ok_or_else(|| anyhow::anyhow!("path too long for ustar: {name}"))?;
            (&name[..split], &name[split + 1..])
        }
    };
    let octal = |h: &mut [u8; 512], at: usize, width: usize, value: u64| {
        let text = format!("{value:0w$o}\0", w = width - 1);
        h[at..at + width].copy_from_slice(text.as_bytes());
    };
    h[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut h, 100, 8, u64::from(mode));
    octal(&mut h, 108, 8, u64::from(owner));
    octal(&mut h, 116, 8, u64::from(owner));
    octal(&mut h, 124, 12, size as u64);
    octal(&mut h, 136, 12, mtime);
    h[156] = kind;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
    // The checksum is computed with its own field as spaces.
    h[148..156].fill(b' ');
    let sum: u64 = h.iter().map(|b| u64::from(*b)).sum();
    let text = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(text.as_bytes());
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_entries_give_the_same_bytes_whatever_the_order_added() {
        let mut a = Tree::default();
        a.file("usr/local/bin/x", 0o755, 0, b"binary".to_vec());
        a.dir("tmp", 0o1777, 0);
        let mut b = Tree::default();
        b.dir("tmp", 0o1777, 0);
        b.file("usr/local/bin/x", 0o755, 0, b"binary".to_vec());
        let (ta, tb) = (a.archive(1).unwrap(), b.archive(1).unwrap());
        assert_eq!(ta, tb);
        assert_eq!(ta.len() % 512, 0);
        // tmp/, usr/, usr/local/, usr/local/bin/, the file's header and one data block.
        assert_eq!(ta.len(), 512 * 6 + 1024);
        let names: Vec<&str> = ta
            .chunks(512)
            .filter(|c| c[257..262] == *b"ustar")
            .map(|c| std::str::from_utf8(&c[..100]).unwrap().trim_end_matches('\0'))
            .collect();
        assert_eq!(names, ["tmp/", "usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/x"]);
        assert_ne!(a.archive(2).unwrap(), ta, "the time is in the headers");
    }
}
