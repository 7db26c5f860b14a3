//! Output rings: large writes of the worker's `sys.stdout`/`sys.stderr`
//! travel through shared memory instead of the pipe, announced in the pipe
//! by a token, so they keep their place among everything else written to
//! fd 1/2 (C `printf`, `os.write`, subprocesses). The layout and the token
//! are described on [`cellhost_protocol::frame::RingOffer`].
//!
//! A pipe copies every byte twice (into the pipe's pages, out of them) and
//! allocates, charges and frees those pages; a ring is written once by the
//! worker and read once by the host, with no page churn. A token that does
//! not fit the ring's state (a cell printing a look-alike: it would need the
//! cell's random nonce, and the exact position) is passed on as plain text.

use std::borrow::Cow;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;

use cellhost_protocol::frame::{RING_HEADER, RingOffer};
use memchr::memmem;

use crate::marker::longest_prefix_suffix;

/// Longest token body (`<pos>:<len>`) accepted.
const MAX_BODY: usize = 48;

/// Bytes read from the ring at once.
const PIECE: usize = 1 << 20;

/// The host's side of one ring.
#[derive(Debug)]
pub(crate) struct OutputRing {
    file: File,
    notify: OwnedFd,
    size: u64,
    read_pos: u64,
    buf: Vec<u8>,
}

impl OutputRing {
    /// Takes copies of the worker's ring descriptors (`pidfd_getfd` on the
    /// worker) and checks that the memfd has the announced size.
    ///
    /// # Errors
    /// The worker is gone, the descriptors are not what was announced, or
    /// this host may not take them.
    pub(crate) fn open(worker: &OwnedFd, offer: &RingOffer) -> io::Result<OutputRing> {
        use rustix::process::{PidfdGetfdFlags, pidfd_getfd};
        let memfd = pidfd_getfd(worker, offer.memfd, PidfdGetfdFlags::empty())?;
        let notify = pidfd_getfd(worker, offer.eventfd, PidfdGetfdFlags::empty())?;
        let file = File::from(memfd);
        let meta = file.metadata()?;
        if !meta.is_file() || meta.len() != RING_HEADER + offer.size || offer.size < 2 * PIECE as u64 {
            return Err(io::Error::other(format!(
                "ring of {} is not a {}-byte memfd",
                offer.stream,
                RING_HEADER + offer.size
            )));
        }
        // The read position the host published last: 0 for a new ring,
        // where it was for a ring of a worker restored from a process
        // checkpoint.
        let mut pos = [0u8; 8];
        file.read_exact_at(&mut pos, 8)?;
        Ok(OutputRing {
            file,
            notify,
            size: offer.size,
            read_pos: u64::from_le_bytes(pos),
            buf: Vec::new(),
        })
    }

    /// Hands the `len` bytes the worker put at `pos` to `sink`, in pieces
    /// of at most 1 MiB, then publishes the new read position and wakes
    /// the worker. `false` (nothing read) when `pos`/`len` do not match the
    /// ring's state: the token was not the worker's.
    ///
    /// # Errors
    /// Reading the memfd or writing the header or eventfd failed.
    pub(crate) fn consume(&mut self, pos: u64, len: u64, mut sink: impl FnMut(&[u8])) -> io::Result<bool> {
        if pos != self.read_pos || len == 0 || len > self.size / 2 {
            return Ok(false);
        }
        if self.buf.len() != PIECE {
            // Sized once: no zeroing per piece.
            self.buf = vec![0; PIECE];
        }
        let mut done = 0u64;
        while done < len {
            let at = (pos + done) % self.size;
            let n = (len - done).min(self.size - at).min(PIECE as u64) as usize;
            let piece = &mut self.buf[..n];
            self.file.read_exact_at(piece, RING_HEADER + at)?;
            sink(piece);
            done += n as u64;
        }
        self.read_pos += len;
        self.file.write_all_at(&self.read_pos.to_le_bytes(), 8)?;
        rustix::io::write(&self.notify, &1u64.to_ne_bytes())?;
        Ok(true)
    }
}

/// A piece of a stream after the ring tokens were picked out.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Piece<'a> {
    /// Bytes written to the pipe.
    Bytes(Cow<'a, [u8]>),
    /// A token: `len` bytes at ring position `pos`; `raw` is the token's
    /// text, passed on as output if the ring does not confirm it.
    Ring { pos: u64, len: u64, raw: Vec<u8> },
}

/// Finds the ring tokens of one cell (its marker nonce) in one stream,
/// across reads split anywhere.
#[derive(Debug)]
pub(crate) struct RingTokens {
    prefix: memmem::Finder<'static>,
    held: Vec<u8>,
}

impl RingTokens {
    /// Tokens carrying `nonce` (the cell's marker nonce).
    pub(crate) fn new(nonce: &str) -> Self {
        let prefix = format!("\u{1}cellhost-ring-{nonce}:").into_bytes();
        RingTokens {
            prefix: memmem::Finder::new(&prefix).into_owned(),
            held: Vec::new(),
        }
    }

    /// Splits `chunk` into pieces; a possible token cut by the end of the
    /// chunk is held back for the next call.
    pub(crate) fn feed<'a>(&mut self, chunk: &'a [u8]) -> Vec<Piece<'a>> {
        if self.held.is_empty() {
            return self.split(chunk, Cow::Borrowed);
        }
        let mut data = std::mem::take(&mut self.held);
        data.extend_from_slice(chunk);
        self.split(&data, |b| Cow::Owned(b.to_vec()))
    }

    /// Bytes held back at the end of the stream (or of the cell).
    pub(crate) fn take_held(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }

    fn split<'a, 'b>(&mut self, data: &'b [u8], out: impl Fn(&'b [u8]) -> Cow<'a, [u8]>) -> Vec<Piece<'a>> {
        let mut pieces = Vec::new();
        let plen = self.prefix.needle().len();
        let mut pos = 0;
        while pos < data.len() {
            let Some(i) = self.prefix.find(&data[pos..]).map(|i| pos + i) else {
                let keep = longest_prefix_suffix(&data[pos..], self.prefix.needle());
                let end = data.len() - keep;
                if end > pos {
                    pieces.push(Piece::Bytes(out(&data[pos..end])));
                }
                self.held = data[end..].to_vec();
                return pieces;
            };
            if i > pos {
                pieces.push(Piece::Bytes(out(&data[pos..i])));
            }
            let body_start = i + plen;
            let window = &data[body_start..data.len().min(body_start + MAX_BODY + 1)];
            match memchr::memchr(1, window) {
                Some(j) => {
                    let end = body_start + j + 1;
                    match parse_body(&window[..j]) {
                        Some((p, l)) => pieces.push(Piece::Ring {
                            pos: p,
                            len: l,
                            raw: data[i..end].to_vec(),
                        }),
                        None => pieces.push(Piece::Bytes(out(&data[i..end]))),
                    }
                    pos = end;
                }
                None if window.len() <= MAX_BODY => {
                    // The token may end in the next read.
                    self.held = data[i..].to_vec();
                    return pieces;
                }
                None => {
                    pieces.push(Piece::Bytes(out(&data[i..body_start])));
                    pos = body_start;
                }
            }
        }
        pieces
    }
}

fn parse_body(body: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(body).ok()?;
    let (p, l) = text.split_once(':')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(p) || !digits(l) {
        return None;
    }
    Some((p.parse().ok()?, l.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(pieces: Vec<Piece<'_>>) -> Vec<String> {
        pieces
            .into_iter()
            .map(|p| match p {
                Piece::Bytes(b) => format!("B:{}", String::from_utf8_lossy(&b)),
                Piece::Ring { pos, len, .. } => format!("R:{pos}:{len}"),
            })
            .collect()
    }

    #[test]
    fn tokens_are_found_between_bytes() {
        let mut t = RingTokens::new("ab12");
        let data = b"hello\x01cellhost-ring-ab12:0:70000\x01world\x01cellhost-ring-ab12:70000:5\x01";
        assert_eq!(
            flat(t.feed(data)),
            vec!["B:hello", "R:0:70000", "B:world", "R:70000:5"]
        );
        assert!(t.take_held().is_empty());
    }

    #[test]
    fn a_token_split_at_every_point_is_found_once() {
        let data = b"x\x01cellhost-ring-ab12:123:456\x01y";
        for cut in 0..=data.len() {
            let mut t = RingTokens::new("ab12");
            let mut got = flat(t.feed(&data[..cut]));
            got.extend(flat(t.feed(&data[cut..])));
            let rings: Vec<&String> = got.iter().filter(|s| s.starts_with("R:")).collect();
            assert_eq!(rings, vec!["R:123:456"], "cut {cut}: {got:?}");
            let text: String = got.iter().filter_map(|s| s.strip_prefix("B:")).collect();
            assert_eq!(text, "xy", "cut {cut}");
        }
    }

    #[test]
    fn other_nonces_and_malformed_bodies_stay_text() {
        let mut t = RingTokens::new("ab12");
        let data = b"\x01cellhost-ring-ffff:0:1\x01|\x01cellhost-ring-ab12:x:1\x01|\x01cellhost-ring-ab12:";
        let mut got = flat(t.feed(data));
        // The unfinished token at the end is held back, then released.
        got.push(format!("held:{}", String::from_utf8_lossy(&t.take_held())));
        assert_eq!(
            got,
            vec![
                "B:\u{1}cellhost-ring-ffff:0:1\u{1}|",
                "B:\u{1}cellhost-ring-ab12:x:1\u{1}",
                "B:|",
                "held:\u{1}cellhost-ring-ab12:",
            ]
        );
    }

    #[test]
    fn an_unterminated_prefix_is_text_once_it_is_too_long() {
        let mut t = RingTokens::new("ab12");
        let mut data = b"\x01cellhost-ring-ab12:".to_vec();
        data.extend(std::iter::repeat_n(b'9', 100));
        let got = flat(t.feed(&data));
        assert_eq!(got.concat().len(), data.len() + 2 * got.len());
        assert!(got.iter().all(|s| s.starts_with("B:")));
    }
}
