//! Incremental, lossy UTF-8 decoding.
//!
//! Output arrives from a pipe in arbitrary pieces, so a multibyte character
//! may be split across two reads. [`Utf8Decoder`] keeps at most three bytes
//! of an unfinished character between calls and otherwise hands out
//! borrowed `&str` slices of the input (no copy on the common path).
//!
//! Invalid input is replaced exactly as [`String::from_utf8_lossy`] would
//! replace it in the concatenated stream: one U+FFFD per maximal invalid
//! subsequence, whatever the split points. Surrogate encodings (CESU-8,
//! `ED A0 80`) are invalid UTF-8 and become U+FFFD as well.

/// The replacement character, as text.
pub(crate) const REPLACEMENT: &str = "\u{FFFD}";

/// Decoder state: the bytes of one unfinished character (at most 3).
#[derive(Debug, Default)]
pub(crate) struct Utf8Decoder {
    pending: [u8; 4],
    len: usize,
}

/// Width in bytes of the character a valid lead byte starts.
fn char_width(lead: u8) -> usize {
    match lead {
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => 1,
    }
}

/// Length of `b` without a trailing unfinished multibyte sequence (judged
/// by its lead byte only; validation happens later).
fn complete_prefix_len(b: &[u8]) -> usize {
    let n = b.len();
    for k in 1..=n.min(3) {
        let byte = b[n - k];
        if byte & 0xC0 != 0x80 {
            return if byte >= 0xC0 && char_width(byte) > k {
                n - k
            } else {
                n
            };
        }
    }
    n
}

/// True if `bytes` is a valid but unfinished prefix of one character.
fn is_incomplete_prefix(bytes: &[u8]) -> bool {
    bytes.len() < 4
        && matches!(std::str::from_utf8(bytes), Err(e) if e.valid_up_to() == 0 && e.error_len().is_none())
}

impl Utf8Decoder {
    /// No unfinished character is pending.
    pub(crate) fn is_idle(&self) -> bool {
        self.len == 0
    }

    /// Decodes `input`, calling `emit` with each decoded piece in order.
    /// Pieces are never empty.
    pub(crate) fn decode(&mut self, input: &[u8], emit: &mut impl FnMut(&str)) {
        let mut input = input;
        if self.len > 0 {
            match self.finish_pending(input, emit) {
                Some(consumed) => input = &input[consumed..],
                None => return,
            }
        }
        // Fast path: a valid body and maybe an unfinished last character.
        let body_len = complete_prefix_len(input);
        let (body, tail) = input.split_at(body_len);
        if let Ok(s) = std::str::from_utf8(body) {
            if !s.is_empty() {
                emit(s);
            }
            if tail.is_empty() {
                return;
            }
            if is_incomplete_prefix(tail) {
                self.pending[..tail.len()].copy_from_slice(tail);
                self.len = tail.len();
                return;
            }
            input = tail;
        }
        self.decode_lossy(input, emit);
    }

    /// The general path: valid runs and one U+FFFD per invalid run.
    fn decode_lossy(&mut self, input: &[u8], emit: &mut impl FnMut(&str)) {
        let mut chunks = input.utf8_chunks().peekable();
        while let Some(chunk) = chunks.next() {
            if !chunk.valid().is_empty() {
                emit(chunk.valid());
            }
            let invalid = chunk.invalid();
            if invalid.is_empty() {
                continue;
            }
            if chunks.peek().is_none() && is_incomplete_prefix(invalid) {
                self.pending[..invalid.len()].copy_from_slice(invalid);
                self.len = invalid.len();
            } else {
                emit(REPLACEMENT);
            }
        }
    }

    /// Completes (or rejects) the pending character with the first bytes of
    /// `input`. Returns how many bytes of `input` it used, or `None` when
    /// `input` was too short and everything is still pending.
    fn finish_pending(&mut self, input: &[u8], emit: &mut impl FnMut(&str)) -> Option<usize> {
        let have = self.len;
        let need = char_width(self.pending[0]).saturating_sub(have);
        let take = need.min(input.len());
        let mut tmp = [0u8; 8];
        tmp[..have].copy_from_slice(&self.pending[..have]);
        tmp[have..have + take].copy_from_slice(&input[..take]);
        let tmp = &tmp[..have + take];
        match std::str::from_utf8(tmp) {
            Ok(s) => {
                self.len = 0;
                emit(s);
                Some(take)
            }
            Err(e) => match e.error_len() {
                Some(n) => {
                    self.len = 0;
                    emit(REPLACEMENT);
                    if n >= have {
                        Some(n - have)
                    } else {
                        // Not reachable for a valid pending prefix; decode
                        // the leftover pending bytes on their own.
                        let rest = tmp[n..have].to_vec();
                        self.decode(&rest, emit);
                        Some(0)
                    }
                }
                None => {
                    // Still unfinished: everything so far stays pending.
                    self.pending[..tmp.len()].copy_from_slice(tmp);
                    self.len = tmp.len();
                    None
                }
            },
        }
    }

    /// End of stream: an unfinished character becomes one U+FFFD.
    pub(crate) fn finish(&mut self, emit: &mut impl FnMut(&str)) {
        if self.len > 0 {
            self.len = 0;
            emit(REPLACEMENT);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_pieces(pieces: &[&[u8]]) -> String {
        let mut d = Utf8Decoder::default();
        let mut out = String::new();
        let mut emit = |s: &str| {
            assert!(!s.is_empty(), "empty piece emitted");
            out.push_str(s);
        };
        for p in pieces {
            d.decode(p, &mut emit);
        }
        d.finish(&mut emit);
        out
    }

    /// ASCII, 2-, 3- and 4-byte characters, invalid bytes, a truncated
    /// sequence followed by ASCII, an overlong encoding, and a CESU-8
    /// surrogate.
    const MIXED: &[u8] = b"a\xc3\xa9b\xe2\x82\xac\xf0\x9f\x98\x80c\xff\xfe d\xe2\x82x \xc0\xaf \xed\xa0\x80 \xf0\x9f\x98 end\xe2\x82";

    #[test]
    fn every_single_split_point_matches_lossy() {
        let expected = String::from_utf8_lossy(MIXED).into_owned();
        for i in 0..=MIXED.len() {
            let got = decode_pieces(&[&MIXED[..i], &MIXED[i..]]);
            assert_eq!(got, expected, "split at {i}");
        }
    }

    #[test]
    fn every_pair_of_split_points_matches_lossy() {
        let expected = String::from_utf8_lossy(MIXED).into_owned();
        for i in 0..=MIXED.len() {
            for j in i..=MIXED.len() {
                let got = decode_pieces(&[&MIXED[..i], &MIXED[i..j], &MIXED[j..]]);
                assert_eq!(got, expected, "split at {i},{j}");
            }
        }
    }

    #[test]
    fn byte_by_byte_matches_lossy() {
        let pieces: Vec<&[u8]> = MIXED.chunks(1).collect();
        assert_eq!(decode_pieces(&pieces), String::from_utf8_lossy(MIXED));
    }

    #[test]
    fn surrogate_encoding_becomes_replacement() {
        let got = decode_pieces(&[b"\xed\xa0", b"\x80"]);
        assert_eq!(got, String::from_utf8_lossy(b"\xed\xa0\x80"));
        assert!(got.chars().all(|c| c == '\u{FFFD}'));
        assert!(!got.is_empty());
    }

    #[test]
    fn split_emoji_decodes_exactly() {
        let emoji = "😀".as_bytes();
        for i in 1..emoji.len() {
            assert_eq!(decode_pieces(&[&emoji[..i], &emoji[i..]]), "😀");
        }
    }

    #[test]
    fn truncated_character_at_end_is_one_replacement() {
        assert_eq!(decode_pieces(&[b"ok\xf0\x9f", b"\x98"]), "ok\u{FFFD}");
    }

    #[test]
    fn invalid_continuation_after_pending_keeps_following_ascii() {
        assert_eq!(decode_pieces(&[b"\xe2\x82", b"A"]), "\u{FFFD}A");
        assert_eq!(decode_pieces(&[b"\xe2", b"\x82", b"A"]), "\u{FFFD}A");
    }
}
