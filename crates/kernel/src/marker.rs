//! Finding a cell's end marker in a raw output stream.
//!
//! The marker is a fresh random token per cell, so a cell that prints a
//! look-alike can at most fake the end of its own cell. The scanner works on
//! raw bytes split anywhere: the longest suffix of a read that is a prefix of
//! the marker is held back until the next read decides it.

use std::borrow::Cow;

use memchr::memmem;

/// Scans one stream for one marker.
#[derive(Debug)]
pub(crate) struct MarkerScanner {
    finder: memmem::Finder<'static>,
    held: Vec<u8>,
}

/// What a chunk held. Borrows the chunk unless bytes held back from the
/// previous chunk had to be joined to it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Scan<'a> {
    /// Bytes that belong to the cell.
    pub before: Cow<'a, [u8]>,
    /// The marker was found.
    pub found: bool,
    /// Bytes after the marker (not the cell's).
    pub after: Cow<'a, [u8]>,
}

impl MarkerScanner {
    pub(crate) fn new(marker: &[u8]) -> Self {
        MarkerScanner {
            finder: memmem::Finder::new(marker).into_owned(),
            held: Vec::new(),
        }
    }

    pub(crate) fn feed<'a>(&mut self, chunk: &'a [u8]) -> Scan<'a> {
        if self.held.is_empty() {
            return self.scan(chunk, Cow::Borrowed);
        }
        // Rare: a possible marker prefix was held back; join it.
        let mut data = std::mem::take(&mut self.held);
        data.extend_from_slice(chunk);
        self.scan(&data, |b| Cow::Owned(b.to_vec()))
    }

    fn scan<'a, 'b>(&mut self, data: &'b [u8], out: impl Fn(&'b [u8]) -> Cow<'a, [u8]>) -> Scan<'a> {
        let marker = self.finder.needle();
        if let Some(i) = self.finder.find(data) {
            return Scan {
                before: out(&data[..i]),
                found: true,
                after: out(&data[i + marker.len()..]),
            };
        }
        let keep = longest_prefix_suffix(data, marker);
        self.held = data[data.len() - keep..].to_vec();
        Scan {
            before: out(&data[..data.len() - keep]),
            found: false,
            after: Cow::Borrowed(&[]),
        }
    }

    /// Bytes held back (a possible marker prefix) when the stream ended.
    pub(crate) fn take_held(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }
}

/// Length of the longest suffix of `data` that is a proper prefix of `marker`.
pub(crate) fn longest_prefix_suffix(data: &[u8], marker: &[u8]) -> usize {
    let max = (marker.len() - 1).min(data.len());
    (1..=max)
        .rev()
        .find(|&k| data[data.len() - k..] == marker[..k])
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_split_at_every_point_is_found_once() {
        let marker = b"@@cellhost-end-0123abcd@@";
        let mut stream = b"hello @@cellhost-end-0123abce@@ world\n".to_vec();
        stream.extend_from_slice(marker);
        stream.extend_from_slice(b"late");
        for cut in 0..stream.len() {
            for cut2 in cut..stream.len() {
                let mut s = MarkerScanner::new(marker);
                let mut before = Vec::new();
                let mut after = Vec::new();
                let mut found = 0;
                for part in [&stream[..cut], &stream[cut..cut2], &stream[cut2..]] {
                    if found > 0 {
                        after.extend_from_slice(part);
                        continue;
                    }
                    let r = s.feed(part);
                    before.extend_from_slice(&r.before);
                    after.extend_from_slice(&r.after);
                    found += r.found as usize;
                }
                assert_eq!(found, 1, "cut {cut} {cut2}");
                assert_eq!(before, b"hello @@cellhost-end-0123abce@@ world\n");
                assert_eq!(after, b"late");
            }
        }
    }

    #[test]
    fn near_prefix_is_released_when_it_turns_out_not_to_be_the_marker() {
        let mut s = MarkerScanner::new(b"@@end@@");
        assert_eq!(&*s.feed(b"abc@@e").before, b"abc");
        let r = s.feed(b"x");
        assert_eq!(&*r.before, b"@@ex");
        assert!(!r.found);
        assert!(s.take_held().is_empty());
    }
}
