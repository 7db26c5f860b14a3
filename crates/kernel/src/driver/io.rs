//! Output bytes: markers found, the running cell's bytes captured (live
//! events, `peek` tails), everything else kept as background text.

use super::state::{ActiveCell, Driver, PEEK_TAIL};
use crate::cell::LiveEvent;
use crate::link::{Stream, WorkerLink};
use crate::seal::{self, BACKGROUND_CAP};

impl<L: WorkerLink> Driver<L> {
    /// Bytes of one stream: before the running cell's start marker they are
    /// earlier cells' (background); between its markers its own (through
    /// the link's side-channel expansion, into its capture); after its end
    /// marker or between cells, background for the next result.
    pub(super) fn on_bytes(&mut self, stream: Stream, bytes: &[u8]) {
        let s = stream.index();
        let n = bytes.len();
        let mut chunk = std::borrow::Cow::Borrowed(bytes);
        if let Some(a) = self.active.as_mut()
            && !a.start_seen[s]
        {
            let scan = a.start_scan[s].feed(&chunk);
            self.raw_background[s].extend_from_slice(&scan.before);
            if !scan.found {
                return;
            }
            a.start_seen[s] = true;
            chunk = std::borrow::Cow::Owned(scan.after.into_owned());
        }
        if let Some(a) = self.active.as_mut()
            && !a.marker_seen[s]
        {
            let scan = a.scan[s].feed(&chunk);
            self.link
                .cell_output(stream, &scan.before, &mut |b| push_capture(a, s, b));
            if scan.found {
                self.link
                    .flush_cell_output(stream, &mut |b| push_capture(a, s, b));
                a.marker_seen[s] = true;
                self.raw_background[s].extend_from_slice(&scan.after);
            }
        } else if self.raw_background[s].len() < 4 * BACKGROUND_CAP {
            self.raw_background[s].extend_from_slice(&chunk);
        } else {
            self.background.dropped += n as u64;
        }
    }

    /// Decodes the raw background bytes that are known to be no cell's (or
    /// the running cell's earlier ones) and keeps them for a result.
    pub(super) fn flush_raw_background(&mut self) {
        for s in 0..2 {
            if self.raw_background[s].is_empty() {
                continue;
            }
            // Before the running cell's start marker: output of earlier
            // cells that this result reports; after its end marker (or
            // between cells): output the next result reports.
            let before_start = self.active.as_ref().is_some_and(|a| !a.start_seen[s]);
            let after_end = self.active.as_ref().is_some_and(|a| a.marker_seen[s]);
            if before_start || self.active.is_none() || after_end {
                let raw = std::mem::take(&mut self.raw_background[s]);
                let text = cellhost_capture::render_once(&raw);
                let text = self.config.redactor.redact(&text);
                match self.active.as_mut().filter(|_| before_start) {
                    Some(a) => {
                        let b = &mut a.background;
                        let buf = if s == 0 { &mut b.stdout } else { &mut b.stderr };
                        seal::push_capped(buf, &mut b.dropped_bytes, &text);
                    }
                    None => self.background.push(s, &text),
                }
            }
        }
    }
}

pub(super) fn push_capture(a: &mut ActiveCell, stream: usize, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let Some(cap) = a.capture[stream].as_mut() else {
        return;
    };
    let peek = &mut a.peek[stream];
    // The live text is assembled only for a subscriber; `peek` keeps a tail.
    let mut live_text = a.q.options.live.as_ref().map(|_| String::new());
    cap.push_with(bytes, |piece| {
        keep_tail(peek, piece);
        if let Some(t) = live_text.as_mut() {
            t.push_str(piece);
        }
    });
    if let (Some(live), Some(text)) = (&a.q.options.live, live_text)
        && !text.is_empty()
    {
        let _ = live.send(if stream == 0 {
            LiveEvent::Stdout(text)
        } else {
            LiveEvent::Stderr(text)
        });
    }
}

/// Appends `text` to `peek`, keeping at most the last `PEEK_TAIL` bytes
/// (cut at a character boundary); of a long `text` only that tail is copied.
fn keep_tail(peek: &mut String, text: &str) {
    if text.len() >= PEEK_TAIL {
        peek.clear();
        peek.push_str(&text[text.ceil_char_boundary(text.len() - PEEK_TAIL)..]);
        return;
    }
    peek.push_str(text);
    if peek.len() > PEEK_TAIL {
        let cut = peek.ceil_char_boundary(peek.len() - PEEK_TAIL);
        peek.drain(..cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_tail_holds_the_last_bytes_on_char_boundaries() {
        let mut peek = String::new();
        let mut all = String::new();
        for i in 0..20_000 {
            let piece = if i % 3 == 0 {
                format!("é{i}\n")
            } else {
                "x".repeat(i % 97)
            };
            keep_tail(&mut peek, &piece);
            all.push_str(&piece);
        }
        assert!(peek.len() <= PEEK_TAIL && peek.len() + 1 >= PEEK_TAIL);
        assert!(all.ends_with(&peek));
        let big = "ü".repeat(PEEK_TAIL);
        keep_tail(&mut peek, &big);
        assert_eq!(peek.len(), PEEK_TAIL);
        assert!(big.ends_with(&peek));
    }
}
