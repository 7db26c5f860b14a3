//! The body of a plain HTTP request the proxy forwards: exactly one
//! request goes upstream per connection, so the proxy finds where its body
//! ends (RFC 9112 §6.3) and passes nothing after it. Bytes a client sends
//! past the body (a second, pipelined request whose `Host` was never
//! checked) are dropped.

/// How a request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `Content-Length: n` (0 when the request has neither header).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// Longest chunk-size line, and most bytes of trailer fields, accepted.
pub const MAX_CHUNK_LINE: usize = 1024;

/// Most bytes of trailer fields after the last chunk.
pub const MAX_TRAILERS: usize = 16 * 1024;

/// Why a body is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadBody;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Remaining bytes of a `Content-Length` body.
    Length(u64),
    /// Inside a chunk-size line (`line` bytes of it so far, `size` parsed
    /// so far, `ext` past a `;`, `cr` a CR seen).
    Size {
        line: usize,
        size: u64,
        digits: bool,
        ext: bool,
        cr: bool,
    },
    /// Remaining bytes of chunk data.
    Data(u64),
    /// The CRLF after chunk data (`cr`: its CR seen).
    DataEnd { cr: bool },
    /// Trailer fields (`total` bytes so far, `line` bytes of the current
    /// line, `cr` a CR seen).
    Trailer { total: usize, line: usize, cr: bool },
    /// The body is complete.
    Done,
}

/// Tracks a body as its bytes pass, without buffering them.
#[derive(Debug, Clone)]
pub struct BodyEnd {
    state: State,
}

impl BodyEnd {
    /// A tracker for a body delimited by `framing`.
    pub fn new(framing: Framing) -> BodyEnd {
        let state = match framing {
            Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => Self::size_line(),
        };
        BodyEnd { state }
    }

    fn size_line() -> State {
        State::Size {
            line: 0,
            size: 0,
            digits: false,
            ext: false,
            cr: false,
        }
    }

    /// The body is complete.
    pub fn done(&self) -> bool {
        self.state == State::Done
    }

    /// How many leading bytes of `buf` belong to the body (all of them
    /// while it goes on; fewer once it ends, the rest is not the body's).
    ///
    /// # Errors
    /// [`BadBody`]: malformed chunked framing (a bad size line, a chunk
    /// larger than 2^60 bytes, data not followed by CRLF, lines or
    /// trailers past their bounds).
    pub fn feed(&mut self, buf: &[u8]) -> Result<usize, BadBody> {
        let mut i = 0;
        while i < buf.len() {
            match &mut self.state {
                State::Done => return Ok(i),
                State::Length(n) => {
                    let take = (*n).min((buf.len() - i) as u64);
                    *n -= take;
                    i += take as usize;
                    if *n == 0 {
                        self.state = State::Done;
                    }
                }
                State::Data(n) => {
                    let take = (*n).min((buf.len() - i) as u64);
                    *n -= take;
                    i += take as usize;
                    if *n == 0 {
                        self.state = State::DataEnd { cr: false };
                    }
                }
                State::DataEnd { cr } => {
                    let b = buf[i];
                    i += 1;
                    match (b, *cr) {
                        (b'\r', false) => *cr = true,
                        (b'\n', true) => self.state = Self::size_line(),
                        _ => return Err(BadBody),
                    }
                }
                State::Size {
                    line,
                    size,
                    digits,
                    ext,
                    cr,
                } => {
                    let b = buf[i];
                    i += 1;
                    *line += 1;
                    if *line > MAX_CHUNK_LINE {
                        return Err(BadBody);
                    }
                    if *cr {
                        if b != b'\n' || !*digits {
                            return Err(BadBody);
                        }
                        self.state = if *size == 0 {
                            State::Trailer {
                                total: 0,
                                line: 0,
                                cr: false,
                            }
                        } else {
                            State::Data(*size)
                        };
                        continue;
                    }
                    match b {
                        b'\r' => *cr = true,
                        _ if *ext => {}
                        b';' => *ext = true,
                        b if b.is_ascii_hexdigit() && !*ext => {
                            if *size >= 1 << 56 {
                                return Err(BadBody);
                            }
                            let d = (b as char).to_digit(16).unwrap_or(0);
                            *size = *size * 16 + u64::from(d);
                            *digits = true;
                        }
                        b' ' | b'\t' if *digits => *ext = true,
                        _ => return Err(BadBody),
                    }
                }
                State::Trailer { total, line, cr } => {
                    let b = buf[i];
                    i += 1;
                    *total += 1;
                    if *total > MAX_TRAILERS {
                        return Err(BadBody);
                    }
                    if *cr {
                        if b != b'\n' {
                            return Err(BadBody);
                        }
                        if *line == 0 {
                            self.state = State::Done;
                        } else {
                            *line = 0;
                            *cr = false;
                        }
                        continue;
                    }
                    if b == b'\r' {
                        *cr = true;
                    } else {
                        *line += 1;
                    }
                }
            }
        }
        Ok(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_len(framing: Framing, bytes: &[u8]) -> Result<(usize, bool), BadBody> {
        let mut b = BodyEnd::new(framing);
        let n = b.feed(bytes)?;
        Ok((n, b.done()))
    }

    #[test]
    fn a_length_body_ends_at_its_length() {
        assert_eq!(body_len(Framing::Length(0), b"GET /x"), Ok((0, true)));
        assert_eq!(body_len(Framing::Length(3), b"abcGET /x"), Ok((3, true)));
        assert_eq!(body_len(Framing::Length(10), b"abc"), Ok((3, false)));
    }

    #[test]
    fn a_chunked_body_ends_after_its_last_chunk_and_trailers() {
        let body = b"5\r\nhello\r\n3;x=y\r\nabc\r\n0\r\nTrailer: t\r\n\r\n";
        let mut both = body.to_vec();
        both.extend_from_slice(b"GET /secret HTTP/1.1\r\nHost: evil.test\r\n\r\n");
        assert_eq!(body_len(Framing::Chunked, &both), Ok((body.len(), true)));
        // Byte by byte, the same.
        let mut b = BodyEnd::new(Framing::Chunked);
        let mut n = 0;
        for c in both.chunks(1) {
            n += b.feed(c).expect("ok");
        }
        assert_eq!((n, b.done()), (body.len(), true));
        // Data that looks like the end does not end it.
        let tricky = b"7\r\n\r\n0\r\n\r\n\r\n0\r\n\r\n";
        assert_eq!(body_len(Framing::Chunked, tricky), Ok((tricky.len(), true)));
    }

    #[test]
    fn bad_chunked_framing_is_refused() {
        for bad in [
            &b"x\r\n"[..],
            b"\r\n",
            b"5\r\nhelloXX",
            b"5\nhello",
            b"fffffffffffffffffff\r\n",
            b"0\r\nbad\rline\r\n\r\n",
        ] {
            assert_eq!(body_len(Framing::Chunked, bad), Err(BadBody), "{bad:?}");
        }
        let long = vec![b'1'; MAX_CHUNK_LINE + 1];
        assert_eq!(body_len(Framing::Chunked, &long), Err(BadBody));
    }
}
