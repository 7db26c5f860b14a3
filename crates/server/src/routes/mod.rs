//! Route groups of the HTTP API beside the session and cell routes of
//! [`crate::http`]: each module a group of handlers, each a thin adapter
//! over the request layer.

pub mod cells;
pub mod checkpoints;
pub mod displays;
pub mod files;
pub mod fork;
pub mod packages;

/// `s` percent-encoded for a URL path, `/` kept between segments.
pub(crate) fn encode_path(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A byte stream of `len` bytes of `r`, in 64 KiB chunks, for a response
/// body (stops at the first error).
pub(crate) fn reader_body<R>(r: R, len: u64) -> axum::body::Body
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    use tokio::io::AsyncReadExt;
    let stream = futures_util::stream::unfold(Some((r.take(len), vec![0u8; 64 * 1024])), |st| async move {
        let (mut r, mut buf) = st?;
        match r.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => Some((Ok(axum::body::Bytes::copy_from_slice(&buf[..n])), Some((r, buf)))),
            Err(e) => Some((Err(e), None)),
        }
    });
    axum::body::Body::from_stream(stream)
}

#[cfg(test)]
mod tests {
    #[test]
    fn paths_are_percent_encoded_per_segment() {
        assert_eq!(super::encode_path("a b/c%.png"), "a%20b/c%25.png");
        assert_eq!(super::encode_path("é"), "%C3%A9");
    }
}
