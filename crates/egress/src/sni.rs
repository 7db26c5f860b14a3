//! The server name of a TLS ClientHello (RFC 8446 §4.1.2, RFC 6066 §3),
//! read from the first bytes a client sends into a `CONNECT` tunnel.
//!
//! Only what is needed to find the `server_name` extension is parsed; every
//! length is checked against what is there, so a hostile client can make
//! the parse fail but never read out of bounds or loop.

/// Largest ClientHello the proxy waits for (a handshake message may span
/// records; post-quantum key shares make it about 1.8 KB today).
pub const MAX_HELLO: usize = 32 * 1024;

/// What the bytes so far say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// Not complete yet: read more.
    Incomplete,
    /// Not a TLS ClientHello.
    NotTls,
    /// A ClientHello; its `host_name`, lower-cased, if it carries one.
    ServerName(Option<String>),
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.b.len() < n {
            return None;
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Some(h)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| b[0] as usize)
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2).map(|b| ((b[0] as usize) << 8) | b[1] as usize)
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(n)
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(n)
    }
}

/// Parses the start of a TLS stream (`buf`: every byte the client sent so
/// far into the tunnel).
pub fn parse(buf: &[u8]) -> Hello {
    // Reassemble the handshake layer from the records so far.
    let mut hs: Vec<u8> = Vec::new();
    let mut rest = buf;
    loop {
        if rest.is_empty() {
            break;
        }
        if rest[0] != 0x16 {
            return Hello::NotTls;
        }
        if rest.len() >= 2 && rest[1] != 0x03 {
            return Hello::NotTls;
        }
        if rest.len() < 5 {
            break;
        }
        let len = ((rest[3] as usize) << 8) | rest[4] as usize;
        if len == 0 || len > 16384 + 256 {
            return Hello::NotTls;
        }
        let have = rest.len() - 5;
        let take = have.min(len);
        hs.extend_from_slice(&rest[5..5 + take]);
        if take < len {
            break;
        }
        rest = &rest[5 + len..];
        if hs.len() >= 4 {
            let need = 4 + (((hs[1] as usize) << 16) | ((hs[2] as usize) << 8) | hs[3] as usize);
            if hs.len() >= need {
                break;
            }
        }
    }
    if hs.is_empty() {
        return if buf.len() > MAX_HELLO {
            Hello::NotTls
        } else {
            Hello::Incomplete
        };
    }
    if hs[0] != 0x01 {
        return Hello::NotTls;
    }
    if hs.len() < 4 {
        return Hello::Incomplete;
    }
    let body_len = ((hs[1] as usize) << 16) | ((hs[2] as usize) << 8) | hs[3] as usize;
    if body_len + 4 > MAX_HELLO {
        return Hello::NotTls;
    }
    if hs.len() < 4 + body_len {
        return if buf.len() > MAX_HELLO + 1024 {
            Hello::NotTls
        } else {
            Hello::Incomplete
        };
    }
    match server_name(&hs[4..4 + body_len]) {
        Some(name) => Hello::ServerName(name),
        None => Hello::NotTls,
    }
}

/// `None`: malformed; `Some(None)`: no `server_name` extension.
fn server_name(body: &[u8]) -> Option<Option<String>> {
    let mut r = Reader { b: body };
    r.take(2 + 32)?; // legacy_version, random
    r.vec8()?; // legacy_session_id
    r.vec16()?; // cipher_suites
    r.vec8()?; // legacy_compression_methods
    if r.b.is_empty() {
        return Some(None);
    }
    let mut exts = Reader { b: r.vec16()? };
    let mut found: Option<String> = None;
    while !exts.b.is_empty() {
        let ty = exts.u16()?;
        let data = exts.vec16()?;
        if ty != 0 {
            continue;
        }
        if found.is_some() {
            // Two server_name extensions: malformed (RFC 8446 §4.2).
            return None;
        }
        let mut list = Reader {
            b: Reader { b: data }.vec16()?,
        };
        while !list.b.is_empty() {
            let kind = list.u8()?;
            let name = list.vec16()?;
            if kind == 0 {
                if found.is_some() {
                    return None;
                }
                let s = std::str::from_utf8(name).ok()?;
                found = Some(s.to_ascii_lowercase());
            }
        }
        found.as_ref()?;
    }
    Some(found)
}

/// A minimal ClientHello record with the given server name.
#[cfg(test)]
pub(crate) fn tests_hello(name: Option<&str>) -> Vec<u8> {
    let mut body = vec![0x03, 0x03];
    body.extend([7u8; 32]);
    body.push(0); // session id
    body.extend([0, 2, 0x13, 0x01]); // one cipher suite
    body.extend([1, 0]); // null compression
    let mut exts = Vec::new();
    if let Some(n) = name {
        let mut sn = vec![0u8];
        sn.extend((n.len() as u16).to_be_bytes());
        sn.extend(n.as_bytes());
        let mut list = (sn.len() as u16).to_be_bytes().to_vec();
        list.extend(sn);
        exts.extend([0, 0]);
        exts.extend((list.len() as u16).to_be_bytes());
        exts.extend(list);
    }
    exts.extend([0, 43, 0, 3, 2, 3, 4]); // supported_versions
    body.extend((exts.len() as u16).to_be_bytes());
    body.extend(exts);
    let mut hs = vec![1u8];
    hs.extend(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend(body);
    let mut rec = vec![0x16, 0x03, 0x01];
    rec.extend((hs.len() as u16).to_be_bytes());
    rec.extend(hs);
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(n: Option<&str>) -> Vec<u8> {
        tests_hello(n)
    }

    #[test]
    fn finds_the_server_name() {
        let h = hello(Some("Allowed.Test"));
        assert_eq!(parse(&h), Hello::ServerName(Some("allowed.test".into())));
        assert_eq!(parse(&hello(None)), Hello::ServerName(None));
    }

    #[test]
    fn waits_for_every_byte_and_never_panics_on_a_prefix_or_garbage() {
        let h = hello(Some("allowed.test"));
        for n in 0..h.len() {
            assert_eq!(parse(&h[..n]), Hello::Incomplete, "prefix {n}");
        }
        for i in 5..h.len() {
            for v in [0u8, 0xff, 0x7f] {
                let mut g = h.clone();
                g[i] = v;
                let _ = parse(&g);
            }
        }
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        assert_eq!(parse(&[0x16, 0x03, 0x01, 0, 0]), Hello::NotTls);
    }

    #[test]
    fn a_hello_split_over_two_records_is_reassembled() {
        let h = hello(Some("a.example.com"));
        let hs = &h[5..];
        let (a, b) = hs.split_at(10);
        let mut two = vec![0x16, 0x03, 0x01];
        two.extend((a.len() as u16).to_be_bytes());
        two.extend(a);
        two.extend([0x16, 0x03, 0x01]);
        two.extend((b.len() as u16).to_be_bytes());
        two.extend(b);
        assert_eq!(parse(&two), Hello::ServerName(Some("a.example.com".into())));
    }
}
