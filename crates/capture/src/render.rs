//! Terminal rendering of a decoded text stream, in bounded memory.
//!
//! The renderer models one terminal row (the *current line*) with a cursor
//! and commits text that can no longer change:
//!
//! * `\n` commits the current line plus the newline;
//! * `\r` moves the cursor to the start of the current line; later text
//!   overwrites character by character (`"abcdef\rXY"` → `XYcdef`), so
//!   `\r\n` is a plain newline and a progress bar keeps its last frame;
//! * `\b` moves the cursor back one character, never past the line start;
//! * ANSI escape sequences are removed: CSI (`ESC [ … final`), OSC and the
//!   other string sequences (`ESC ] … BEL` or `ESC ] … ESC \`, also DCS,
//!   SOS, PM, APC), and two- or three-character escapes; `ESC[K` (erase to
//!   end of line), `ESC[1K` (erase to the cursor), `ESC[2K` (erase the line,
//!   the cursor stays), and the horizontal cursor moves `ESC[nG`, `ESC[nC`,
//!   `ESC[nD` are honoured; everything else (colours, cursor up/down,
//!   screen erase, private modes) is dropped. Sequences may be split across
//!   any number of feeds;
//! * `\t` is kept as text; every other C0 control, DEL and the C1 controls
//!   (U+0080–U+009F) are dropped.
//!
//! Columns are counted in characters (not display cells). A line longer
//! than `max_line_bytes` wraps like a terminal row: once more text arrives
//! past that width, the full row is committed and the cursor continues on a
//! fresh row, so a later `\r` only reaches back to the start of that last,
//! uncommitted row. Wrapping inserts no newline, so the committed text is
//! exactly the line's text. Memory is O(`max_line_bytes`) whatever the line
//! length.
//!
//! A string sequence (OSC, DCS, …) that runs on for more than
//! [`MAX_STRING_SEQ`] bytes, or reaches a newline, is abandoned and what
//! follows is shown as text, so a stray `ESC ]` cannot swallow the rest of a
//! cell's output.

use memchr::{memchr3, memrchr};

/// Longest OSC/DCS/… string sequence accepted before it is abandoned.
pub const MAX_STRING_SEQ: usize = 4096;
/// Longest CSI sequence accepted before it is abandoned.
const MAX_CSI: usize = 256;

const SPACES: &str = "                                                                ";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Ground,
    Esc,
    EscInter,
    Csi,
    Str,
    StrEsc,
}

/// Streaming terminal renderer; see the module docs.
#[derive(Debug)]
pub(crate) struct Renderer {
    max_line: usize,
    line: String,
    line_chars: usize,
    line_ascii: bool,
    col: usize,
    state: State,
    seq_len: usize,
    csi_param: Option<u64>,
    csi_param_done: bool,
    csi_ignore: bool,
}

/// `s` contains a byte the slow path must look at: a C0 control other than
/// `\t` (and other than `\n` unless `NL`), DEL, or the lead byte `0xC2` of
/// U+0080–U+00BF (which holds the C1 controls).
#[inline(always)]
fn is_special<const NL: bool>(b: u8) -> bool {
    ((b < 0x20) & (b != b'\t') & (NL | (b != b'\n'))) | (b == 0x7f) | (b == 0xc2)
}

/// Position of the first special byte (see [`is_special`]). Scans 64-byte
/// blocks with a branch-free test the compiler vectorizes.
fn find_special<const NL: bool>(s: &[u8]) -> Option<usize> {
    const W: usize = 64;
    let mut chunks = s.chunks_exact(W);
    let mut base = 0;
    for c in &mut chunks {
        let mut any = false;
        for &b in c {
            any |= is_special::<NL>(b);
        }
        if any {
            return c.iter().position(|&b| is_special::<NL>(b)).map(|p| base + p);
        }
        base += W;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| is_special::<NL>(b))
        .map(|p| base + p)
}

/// Number of characters in `s`.
#[inline]
fn char_count(s: &str) -> usize {
    if s.is_ascii() { s.len() } else { s.chars().count() }
}

/// Largest char boundary of `s` that is `<= i`.
#[inline]
pub(crate) fn floor_boundary(s: &str, i: usize) -> usize {
    s.floor_char_boundary(i)
}

/// Length of the longest prefix of `s` that fits in `max` bytes, but at
/// least one character (so wrapping always makes progress).
fn row_cut(s: &str, max: usize) -> usize {
    let c = floor_boundary(s, max);
    if c == 0 {
        s.chars().next().map_or(0, char::len_utf8)
    } else {
        c
    }
}

impl Renderer {
    /// A renderer that wraps rows at `max_line_bytes` (at least 4).
    pub(crate) fn new(max_line_bytes: usize) -> Self {
        Renderer {
            max_line: max_line_bytes.max(4),
            line: String::new(),
            line_chars: 0,
            line_ascii: true,
            col: 0,
            state: State::Ground,
            seq_len: 0,
            csi_param: None,
            csi_param_done: false,
            csi_ignore: false,
        }
    }

    /// Bytes held for the current line (capacity), for memory accounting.
    #[cfg(test)]
    pub(crate) fn buffered(&self) -> usize {
        self.line.capacity()
    }

    /// Renders `s`, appending committed text to `out`.
    pub(crate) fn feed(&mut self, s: &str, out: &mut String) {
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            match self.state {
                State::Ground => {
                    if self.line.is_empty() && self.col == 0 {
                        // Fast path: whole lines of plain text go straight out.
                        let stop = find_special::<false>(&b[i..]).map_or(b.len(), |p| i + p);
                        if let Some(p) = memrchr(b'\n', &b[i..stop]) {
                            let end = i + p + 1;
                            if self.lines_fit(&b[i..end]) {
                                out.push_str(&s[i..end]);
                                i = end;
                                continue;
                            }
                        }
                    }
                    let j = find_special::<true>(&b[i..]).map_or(b.len(), |p| i + p);
                    if j > i {
                        self.put_text(&s[i..j], out);
                        i = j;
                        if i == b.len() {
                            break;
                        }
                    }
                    match b[i] {
                        b'\n' => {
                            self.newline(out);
                            i += 1;
                        }
                        b'\r' => {
                            self.col = 0;
                            i += 1;
                        }
                        0x08 => {
                            self.col = self.col.saturating_sub(1);
                            i += 1;
                        }
                        0x1b => {
                            self.state = State::Esc;
                            self.seq_len = 0;
                            i += 1;
                        }
                        0xc2 => {
                            // U+0080..U+00BF: C1 controls are dropped, the rest is text.
                            let second = b.get(i + 1).copied().unwrap_or(0);
                            if second >= 0xa0 {
                                self.put_text(&s[i..i + 2], out);
                            }
                            i += 2;
                        }
                        _ => i += 1,
                    }
                }
                State::Esc => {
                    let c = b[i];
                    match c {
                        b'[' => {
                            self.state = State::Csi;
                            self.seq_len = 0;
                            self.csi_param = None;
                            self.csi_param_done = false;
                            self.csi_ignore = false;
                            i += 1;
                        }
                        b']' | b'P' | b'X' | b'^' | b'_' => {
                            self.state = State::Str;
                            self.seq_len = 0;
                            i += 1;
                        }
                        0x1b => i += 1,
                        0x20..=0x2f => {
                            self.state = State::EscInter;
                            i += 1;
                        }
                        0x30..=0x7e => {
                            self.state = State::Ground;
                            i += 1;
                        }
                        // A control or non-ASCII byte aborts the escape; it is
                        // then handled as ordinary input.
                        _ => self.state = State::Ground,
                    }
                }
                State::EscInter => match b[i] {
                    0x20..=0x2f => {
                        self.seq_len += 1;
                        i += 1;
                        if self.seq_len > MAX_CSI {
                            self.state = State::Ground;
                        }
                    }
                    0x30..=0x7e => {
                        self.state = State::Ground;
                        i += 1;
                    }
                    _ => self.state = State::Ground,
                },
                State::Csi => {
                    let c = b[i];
                    match c {
                        0x30..=0x3f => {
                            self.csi_byte(c);
                            i += 1;
                        }
                        0x20..=0x2f => {
                            self.csi_ignore = true;
                            i += 1;
                        }
                        0x40..=0x7e => {
                            self.csi_dispatch(c);
                            self.state = State::Ground;
                            i += 1;
                        }
                        0x1b => {
                            self.state = State::Esc;
                            i += 1;
                        }
                        _ => self.state = State::Ground,
                    }
                    self.seq_len += 1;
                    if self.state == State::Csi && self.seq_len > MAX_CSI {
                        self.state = State::Ground;
                    }
                }
                State::Str => {
                    let rest = &b[i..];
                    let limit = MAX_STRING_SEQ.saturating_sub(self.seq_len);
                    match memchr3(0x07, 0x1b, b'\n', rest) {
                        Some(p) if p <= limit => {
                            i += p;
                            match b[i] {
                                0x07 => {
                                    self.state = State::Ground;
                                    i += 1;
                                }
                                0x1b => {
                                    self.state = State::StrEsc;
                                    i += 1;
                                }
                                // A newline ends a runaway string; it is rendered.
                                _ => self.state = State::Ground,
                            }
                        }
                        _ if rest.len() <= limit => {
                            self.seq_len += rest.len();
                            i = b.len();
                        }
                        _ => {
                            // Too long: abandon the sequence, show what follows.
                            self.state = State::Ground;
                            i = s.ceil_char_boundary(i + limit);
                        }
                    }
                }
                State::StrEsc => {
                    if b[i] == b'\\' {
                        self.state = State::Ground;
                        i += 1;
                    } else {
                        // ESC ends the string and starts a new escape.
                        self.state = State::Esc;
                    }
                }
            }
        }
    }

    /// Nothing is pending: an empty line, the cursor at its start, no
    /// escape sequence.
    pub(crate) fn is_clean(&self) -> bool {
        self.state == State::Ground && self.line.is_empty() && self.col == 0
    }

    /// Length of the longest prefix of `b` that this renderer would commit
    /// verbatim: whole lines (up to the last `\n`) of plain text that fit a
    /// row, while nothing is pending (empty line, cursor at the start, no
    /// escape sequence). 0 when there is none. Feeding the prefix would
    /// leave the renderer as it is, so a caller may pass it on as it is.
    pub(crate) fn plain_lines(&self, b: &[u8]) -> usize {
        if !self.is_clean() {
            return 0;
        }
        let Some(p) = memrchr(b'\n', b) else {
            return 0;
        };
        let lines = &b[..=p];
        if find_special::<false>(lines).is_some() || !self.lines_fit(lines) {
            return 0;
        }
        lines.len()
    }

    /// End of stream: commits the current line as is (no newline added) and
    /// drops an unfinished escape sequence.
    pub(crate) fn finish(&mut self, out: &mut String) {
        out.push_str(&self.line);
        self.clear_line();
        self.col = 0;
        self.state = State::Ground;
    }

    /// Every line in `lines` (which ends in `\n`) fits in one row.
    ///
    /// A line starting at `start` fits when its newline is at most
    /// `max_line` bytes further, so the scan jumps from each newline to the
    /// last one within reach (found with `memrchr` near the window's end)
    /// instead of visiting every newline.
    fn lines_fit(&self, lines: &[u8]) -> bool {
        let mut start = 0;
        while lines.len() - start > self.max_line + 1 {
            match memrchr(b'\n', &lines[start..start + self.max_line + 1]) {
                Some(p) => start += p + 1,
                None => return false,
            }
        }
        true
    }

    fn csi_byte(&mut self, c: u8) {
        match c {
            b'0'..=b'9' if !self.csi_param_done => {
                let d = u64::from(c - b'0');
                let v = self.csi_param.unwrap_or(0);
                self.csi_param = Some(v.saturating_mul(10).saturating_add(d));
            }
            b';' | b':' => self.csi_param_done = true,
            b'<' | b'=' | b'>' | b'?' => self.csi_ignore = true,
            _ => {}
        }
    }

    fn csi_dispatch(&mut self, final_byte: u8) {
        if self.csi_ignore {
            return;
        }
        let n = self.csi_param;
        let count = usize::try_from(n.unwrap_or(1).max(1)).unwrap_or(usize::MAX);
        match final_byte {
            b'K' => match n.unwrap_or(0) {
                0 => self.erase_to_end(),
                1 => self.erase_to_cursor(),
                2 => self.clear_line(),
                _ => {}
            },
            b'G' | b'`' => self.col = (count - 1).min(self.max_line),
            b'C' => self.col = self.col.saturating_add(count).min(self.max_line),
            b'D' => self.col = self.col.saturating_sub(count),
            _ => {}
        }
    }

    fn clear_line(&mut self) {
        self.line.clear();
        self.line_chars = 0;
        self.line_ascii = true;
    }

    fn erase_to_end(&mut self) {
        if self.col < self.line_chars {
            let at = self.byte_at(self.col);
            self.line.truncate(at);
            self.line_chars = self.col;
        }
    }

    fn erase_to_cursor(&mut self) {
        // Blanks from the line start through the cursor, inclusive.
        let n = (self.col + 1).min(self.line_chars);
        if n == 0 {
            return;
        }
        let end = self.byte_at(n);
        let mut blanks = String::with_capacity(n);
        for _ in 0..n {
            blanks.push(' ');
        }
        self.line.replace_range(..end, &blanks);
    }

    /// Byte offset of character column `col` in the current line.
    fn byte_at(&self, col: usize) -> usize {
        if self.line_ascii {
            col.min(self.line.len())
        } else {
            self.line
                .char_indices()
                .nth(col)
                .map_or(self.line.len(), |(b, _)| b)
        }
    }

    fn newline(&mut self, out: &mut String) {
        out.push_str(&self.line);
        out.push('\n');
        self.clear_line();
        self.col = 0;
    }

    /// Writes plain text (no controls) at the cursor.
    fn put_text(&mut self, t: &str, out: &mut String) {
        if self.col >= self.line_chars {
            let mut pad = self.col - self.line_chars;
            while pad > 0 {
                let k = pad.min(SPACES.len());
                self.append(&SPACES[..k], out);
                pad -= k;
            }
            self.append(t, out);
            return;
        }
        // Overwrite characters from the cursor on.
        let avail = self.line_chars - self.col;
        let (t1, k) = if t.is_ascii() {
            let k = t.len().min(avail);
            (&t[..k], k)
        } else {
            match t.char_indices().nth(avail) {
                Some((b, _)) => (&t[..b], avail),
                None => (t, t.chars().count()),
            }
        };
        let start = self.byte_at(self.col);
        let end = if self.line_ascii {
            start + k
        } else {
            self.line[start..]
                .char_indices()
                .nth(k)
                .map_or(self.line.len(), |(b, _)| start + b)
        };
        self.line.replace_range(start..end, t1);
        self.line_ascii &= t1.is_ascii();
        self.col += k;
        let t2 = &t[t1.len()..];
        if !t2.is_empty() {
            self.append(t2, out);
        }
    }

    /// Appends at the end of the line (cursor at the end), wrapping rows.
    fn append(&mut self, t: &str, out: &mut String) {
        if self.line.len() + t.len() <= self.max_line {
            self.line.push_str(t);
            self.line_chars += char_count(t);
            self.line_ascii &= t.is_ascii();
            self.col = self.line_chars;
            return;
        }
        // The row overflows: fill it, commit it, continue on fresh rows.
        let room = self.max_line.saturating_sub(self.line.len());
        let mut cut = floor_boundary(t, room);
        if cut == 0 && self.line.is_empty() {
            cut = row_cut(t, self.max_line);
        }
        out.push_str(&self.line);
        out.push_str(&t[..cut]);
        let mut rest = &t[cut..];
        while rest.len() > self.max_line {
            let c = row_cut(rest, self.max_line);
            out.push_str(&rest[..c]);
            rest = &rest[c..];
        }
        self.line.clear();
        self.line.push_str(rest);
        self.line_chars = char_count(rest);
        self.line_ascii = rest.is_ascii();
        self.col = self.line_chars;
    }
}

/// Decodes and renders a complete byte string (no redaction, no size
/// limits; rows wrap at the default 8192 bytes like a live stream).
pub(crate) fn render_all(bytes: &[u8], max_line_bytes: usize) -> String {
    let mut dec = crate::utf8::Utf8Decoder::default();
    let mut r = Renderer::new(max_line_bytes);
    let mut out = String::with_capacity(bytes.len());
    dec.decode(bytes, &mut |s| r.feed(s, &mut out));
    dec.finish(&mut |s| r.feed(s, &mut out));
    r.finish(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(s: &str) -> String {
        render_all(s.as_bytes(), 8192)
    }

    fn render_pieces(pieces: &[&str], max: usize) -> String {
        let mut r = Renderer::new(max);
        let mut out = String::new();
        for p in pieces {
            r.feed(p, &mut out);
        }
        r.finish(&mut out);
        out
    }

    #[test]
    fn carriage_return_overwrites_char_by_char() {
        assert_eq!(render("abcdef\rXY"), "XYcdef");
        assert_eq!(render("abcdef\rXY\n"), "XYcdef\n");
        assert_eq!(render("ab\rXYZW"), "XYZW");
    }

    #[test]
    fn crlf_is_a_plain_newline() {
        assert_eq!(render("one\r\ntwo\r\n"), "one\ntwo\n");
    }

    #[test]
    fn backspace_moves_back_not_past_line_start() {
        assert_eq!(render("abc\x08X"), "abX");
        assert_eq!(render("ab\x08\x08\x08\x08X"), "Xb");
        assert_eq!(render("abc\x08\n"), "abc\n");
        assert_eq!(render("é\x08è"), "è");
    }

    #[test]
    fn progress_frames_keep_only_the_last() {
        let mut s = String::new();
        for i in 1..=5000 {
            s.push_str(&format!("\rstep {i}/5000"));
        }
        s.push_str("\nfinished\n");
        assert_eq!(render(&s), "step 5000/5000\nfinished\n");
    }

    #[test]
    fn tqdm_style_frames_keep_only_the_final_frame() {
        let mut s = String::new();
        for i in (0..=3000).step_by(7).chain([3000]) {
            let pct = i * 100 / 3000;
            let bar = "█".repeat(pct / 10) + &" ".repeat(10 - pct / 10);
            s.push_str(&format!("\r{pct:3}%|{bar}| {i}/3000 [00:00<00:00, 1.00it/s]"));
        }
        s.push('\n');
        let got = render(&s);
        assert_eq!(got, "100%|██████████| 3000/3000 [00:00<00:00, 1.00it/s]\n");
    }

    #[test]
    fn csi_colours_and_modes_are_removed() {
        assert_eq!(render("\x1b[31mred\x1b[0m \x1b[1;32mgreen\x1b[m"), "red green");
        assert_eq!(render("\x1b[?25lhidden\x1b[?25h"), "hidden");
        assert_eq!(render("a\x1b[2Jb\x1b[Hc"), "abc");
    }

    #[test]
    fn osc_and_string_sequences_are_removed() {
        assert_eq!(render("\x1b]0;title\x07text"), "text");
        assert_eq!(
            render("\x1b]8;;http://example.invalid\x1b\\link\x1b]8;;\x1b\\ after"),
            "link after"
        );
        assert_eq!(render("\x1bPdcs-data\x1b\\x"), "x");
    }

    #[test]
    fn two_and_three_char_escapes_are_removed() {
        assert_eq!(render("a\x1b7b\x1b8c\x1bMd"), "abcd");
        assert_eq!(render("a\x1b(Bb\x1b)0c"), "abc");
    }

    #[test]
    fn erase_line_variants() {
        assert_eq!(render("abcdef\r\x1b[Kxy"), "xy");
        assert_eq!(render("abcdef\rab\x1b[K"), "ab");
        assert_eq!(render("abcdef\x1b[2K\rxy"), "xy");
        assert_eq!(render("abcdef\r\x1b[2Kxy\n"), "xy\n");
        // 2K keeps the cursor column: later text lands there.
        assert_eq!(render("abc\x1b[2Kxy"), "   xy");
        assert_eq!(render("abcdef\rab\x1b[1K"), "   def");
        assert_eq!(render("abcdef\x1b[0K!"), "abcdef!");
    }

    #[test]
    fn horizontal_cursor_moves() {
        assert_eq!(render("abcdef\x1b[1GX"), "Xbcdef");
        assert_eq!(render("abcdef\x1b[3DX"), "abcXef");
        assert_eq!(render("ab\x1b[3CX"), "ab   X");
        // Forward moves are clamped to the row width.
        let got = render_pieces(&["a\x1b[999999999CX"], 16);
        assert_eq!(got, format!("a{}X", " ".repeat(15)));
    }

    #[test]
    fn other_controls_are_dropped_tab_kept() {
        assert_eq!(render("a\x00b\x07c\x7fd\x0ce\tf"), "abcde\tf");
        assert_eq!(render("x\u{85}y\u{9b}z\u{a0}°"), "xyz\u{a0}°");
    }

    #[test]
    fn escapes_split_at_every_point() {
        let s = "pre\x1b[1;31mred\x1b[0m\x1b]0;t\x1b\\mid\x1b]8;;u\x07 end\r\x1b[Kfinal\n";
        let expected = render(s);
        assert_eq!(expected, "final\n");
        for i in 0..=s.len() {
            if !s.is_char_boundary(i) {
                continue;
            }
            assert_eq!(render_pieces(&[&s[..i], &s[i..]], 8192), expected, "split {i}");
        }
        let s2 = "a\x1b[31mb\x1b]0;t\x07c\x1b(Bd\n";
        for i in 0..=s2.len() {
            for j in i..=s2.len() {
                let got = render_pieces(&[&s2[..i], &s2[i..j], &s2[j..]], 8192);
                assert_eq!(got, "abcd\n", "split {i},{j}");
            }
        }
    }

    #[test]
    fn long_lines_wrap_and_cr_reaches_only_the_last_row() {
        let got = render_pieces(&["0123456789abcdefghij\rXY"], 10);
        assert_eq!(got, "0123456789XYcdefghij");
        let got = render_pieces(&["0123456789abcdefghijK\rXY"], 10);
        assert_eq!(got, "0123456789abcdefghijXY");
        // Wrapping never inserts characters.
        let long = "x".repeat(100_003);
        assert_eq!(render_pieces(&[&long], 64), long);
    }

    #[test]
    fn wrapped_rows_are_committed_while_streaming() {
        let mut r = Renderer::new(16);
        let mut out = String::new();
        for _ in 0..1000 {
            r.feed("abcdefgh", &mut out);
        }
        assert!(out.len() >= 8000 - 16);
        assert!(r.line.len() <= 16);
        r.finish(&mut out);
        assert_eq!(out, "abcdefgh".repeat(1000));
    }

    #[test]
    fn multibyte_rows_cut_on_char_boundaries() {
        let s = "é".repeat(20);
        let got = render_pieces(&[&s], 5);
        assert_eq!(got, s);
        let got = render_pieces(&["😀😀😀"], 4);
        assert_eq!(got, "😀😀😀");
    }

    #[test]
    fn runaway_osc_is_abandoned() {
        let mut s = String::from("before\x1b]");
        s.push_str(&"y".repeat(MAX_STRING_SEQ + 10));
        s.push_str("\nafter\n");
        let got = render(&s);
        assert!(got.starts_with("before"));
        assert!(got.ends_with("after\n"), "{got:?}");
        // A newline ends an unterminated OSC too.
        assert_eq!(render("a\x1b]0;title\nb\n"), "a\nb\n");
    }

    #[test]
    fn pending_line_is_committed_at_finish_without_newline() {
        assert_eq!(render("no newline"), "no newline");
        assert_eq!(render("tail\x1b["), "tail");
    }

    #[test]
    fn fast_path_respects_wrap_width() {
        let s = format!("{}\nshort\n", "z".repeat(30));
        let got = render_pieces(&[&s], 10);
        assert_eq!(got, s);
        let got = render_pieces(&[&format!("{}\rA\n", "z".repeat(30))], 10);
        assert_eq!(got, format!("{}A{}\n", "z".repeat(20), "z".repeat(9)));
    }

    #[test]
    fn lines_fit_agrees_with_a_line_by_line_check() {
        let max = 16;
        let r = Renderer::new(max);
        let naive = |b: &[u8]| b.split(|&c| c == b'\n').all(|l| l.len() <= max);
        let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
        for _ in 0..2000 {
            let mut b = Vec::new();
            let lines = 1 + (seed % 7) as usize;
            for _ in 0..lines {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                // Lengths around the row width: 0..=2*max, often max or max+1.
                let len = match seed % 4 {
                    0 => max,
                    1 => max + 1,
                    _ => (seed >> 8) as usize % (2 * max + 1),
                };
                b.extend(std::iter::repeat_n(b'a', len));
                b.push(b'\n');
            }
            assert_eq!(r.lines_fit(&b), naive(&b), "{:?}", String::from_utf8_lossy(&b));
        }
    }
}
