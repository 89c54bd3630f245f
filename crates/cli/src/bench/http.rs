//! The plain HTTP/1.1 client of `ferrite bench serve`: one POST per connection
//! (`Connection: close`), a chunked-transfer decoder and a server-sent-events line reader.
//!
//! It speaks only `http://` to the host given, which is all a local server benchmark needs,
//! and it never retries: a failed request is counted as an error by the caller, not hidden.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, bail};

/// Where requests go: `host:port` and the path prefix of the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `host:port` as it is dialled and sent in the `Host` header.
    pub authority: String,
    /// Path prefix without a trailing slash (empty for the server root).
    pub base: String,
}

impl Endpoint {
    /// Parse `http://host[:port][/base]`; the port defaults to 80.
    pub fn parse(url: &str) -> anyhow::Result<Endpoint> {
        let Some(rest) = url.strip_prefix("http://") else {
            bail!("--url must start with http:// (got {url:?}); TLS is not supported");
        };
        let (authority, base) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.is_empty() {
            bail!("--url {url:?} names no host");
        }
        let authority = if authority.contains(':') {
            authority.to_owned()
        } else {
            format!("{authority}:80")
        };
        Ok(Endpoint {
            authority,
            base: base.to_owned(),
        })
    }
}

/// A response whose status was 200, with its body ready to read (de-chunked when needed).
pub struct OkResponse {
    body: Box<dyn BufRead + Send>,
}

impl OkResponse {
    /// The next server-sent event's `data:` payload; `None` at the end of the stream.
    /// Comments (keepalives) and other fields are skipped; multi-line data is joined by `\n`.
    pub fn next_event(&mut self) -> io::Result<Option<String>> {
        let mut data: Option<String> = None;
        loop {
            let mut line = String::new();
            if self.body.read_line(&mut line)? == 0 {
                return Ok(data);
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                if data.is_some() {
                    return Ok(data);
                }
                continue;
            }
            if let Some(value) = line.strip_prefix("data:") {
                let value = value.strip_prefix(' ').unwrap_or(value);
                match &mut data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(value);
                    }
                    None => data = Some(value.to_owned()),
                }
            }
        }
    }
}

/// GET `path` under the endpoint and parse the answer as JSON.
pub fn get_json(
    ep: &Endpoint,
    path: &str,
    api_key: Option<&str>,
    timeout: Duration,
) -> anyhow::Result<serde_json::Value> {
    let mut resp = send(ep, "GET", path, None, api_key, timeout)?;
    let mut text = String::new();
    resp.body.read_to_string(&mut text)?;
    serde_json::from_str(&text).with_context(|| format!("GET {path}: answer is not JSON"))
}

/// POST `body` (JSON) to `path` under the endpoint.
pub fn post_json(
    ep: &Endpoint,
    path: &str,
    body: &str,
    api_key: Option<&str>,
    timeout: Duration,
) -> anyhow::Result<OkResponse> {
    send(ep, "POST", path, Some(body), api_key, timeout)
}

/// One request on a fresh connection. A non-200 status is an error carrying the start of
/// the server's answer.
fn send(
    ep: &Endpoint,
    method: &str,
    path: &str,
    body: Option<&str>,
    api_key: Option<&str>,
    timeout: Duration,
) -> anyhow::Result<OkResponse> {
    let mut stream = TcpStream::connect(&ep.authority)
        .with_context(|| format!("connecting to {}", ep.authority))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;
    let auth = api_key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let body = body.unwrap_or_default();
    let request = format!(
        "{method} {}{path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Accept: text/event-stream, application/json\r\nConnection: close\r\n{auth}\
         Content-Length: {}\r\n\r\n{body}",
        ep.base,
        ep.authority,
        body.len()
    );
    stream.write_all(request.as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line)?;
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("malformed status line {status_line:?}"))?;
    let mut chunked = false;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            bail!("connection closed inside the response headers");
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("transfer-encoding")
            && value.trim().eq_ignore_ascii_case("chunked")
        {
            chunked = true;
        }
    }
    let mut body: Box<dyn BufRead + Send> = if chunked {
        Box::new(BufReader::new(Chunked::new(reader)))
    } else {
        Box::new(reader)
    };
    if status != 200 {
        let mut text = String::new();
        let _ = body.by_ref().take(500).read_to_string(&mut text);
        bail!("HTTP {status}: {}", text.trim());
    }
    Ok(OkResponse { body })
}

/// Decodes `Transfer-Encoding: chunked`; reads end at the zero-length chunk.
struct Chunked<R> {
    inner: R,
    /// Bytes left in the current chunk; `None` before a size line, `Some(0)` when done.
    left: Option<usize>,
    done: bool,
}

impl<R: BufRead> Chunked<R> {
    fn new(inner: R) -> Chunked<R> {
        Chunked {
            inner,
            left: None,
            done: false,
        }
    }

    fn read_size(&mut self) -> io::Result<usize> {
        let mut line = String::new();
        self.inner.read_line(&mut line)?;
        let hex = line.trim().split(';').next().unwrap_or_default();
        usize::from_str_radix(hex, 16).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad chunk size line {line:?}"),
            )
        })
    }
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        let left = match self.left {
            Some(n) if n > 0 => n,
            _ => {
                let n = self.read_size()?;
                if n == 0 {
                    self.done = true;
                    return Ok(0);
                }
                n
            }
        };
        let want = left.min(buf.len());
        let got = self.inner.read(&mut buf[..want])?;
        if got == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let left = left - got;
        if left == 0 {
            // Each chunk's data is followed by CRLF.
            let mut crlf = String::new();
            self.inner.read_line(&mut crlf)?;
        }
        self.left = Some(left);
        Ok(got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_and_without_port_and_base() {
        let e = Endpoint::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            (e.authority.as_str(), e.base.as_str()),
            ("127.0.0.1:8080", "")
        );
        let e = Endpoint::parse("http://localhost/api/").unwrap();
        assert_eq!(
            (e.authority.as_str(), e.base.as_str()),
            ("localhost:80", "/api")
        );
        assert!(Endpoint::parse("https://x").is_err());
        assert!(Endpoint::parse("http:///v1").is_err());
    }

    #[test]
    fn chunked_bodies_decode_across_chunk_boundaries() {
        let wire = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n";
        let mut out = String::new();
        Chunked::new(&wire[..]).read_to_string(&mut out).unwrap();
        assert_eq!(out, "hello, world");
        let bad = b"zz\r\nhello\r\n";
        assert!(
            Chunked::new(&bad[..])
                .read_to_string(&mut String::new())
                .is_err()
        );
    }

    #[test]
    fn events_skip_comments_and_join_data_lines() {
        let wire = ": keepalive\n\ndata: {\"a\":1}\n\ndata: x\ndata: y\n\ndata: [DONE]\n\n";
        let mut r = OkResponse {
            body: Box::new(wire.as_bytes()),
        };
        assert_eq!(r.next_event().unwrap().as_deref(), Some("{\"a\":1}"));
        assert_eq!(r.next_event().unwrap().as_deref(), Some("x\ny"));
        assert_eq!(r.next_event().unwrap().as_deref(), Some("[DONE]"));
        assert_eq!(r.next_event().unwrap(), None);
    }
}
