//! The lab's HTTP: the API client is provision's own ([`pve::Client`], re-exported as
//! [`PveClient`]); [`request`] is a raw blocking HTTP/1.1 call (plain, or TLS through the
//! same pinned verifier) for `download-url` and for tests that look at raw responses.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// A raw HTTP response.
#[derive(Debug)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Reason phrase.
    pub reason: String,
    /// Body bytes.
    pub body: Vec<u8>,
}

pub use pve::client::{Auth, Client as PveClient};
use pve::tls::Trust;
pub use pve::tls::fingerprint;

/// How the lab's callers trust its certificate: pinned when they know the fingerprint.
pub fn trust(pin: Option<&str>) -> Trust {
    pin.map_or(Trust::Insecure, |p| Trust::Pin(p.to_string()))
}

/// One request. `https` URLs are checked against `pin` (any certificate when `None`).
pub fn request(
    method: &str,
    url: &str,
    headers: &[(&str, String)],
    body: &[u8],
    pin: Option<&str>,
) -> Result<HttpResponse> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        bail!("unsupported URL '{url}'");
    };
    let (hostport, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let addr = if hostport.contains(':') {
        hostport.to_string()
    } else {
        format!("{hostport}:{}", if tls { 443 } else { 80 })
    };
    let tcp = TcpStream::connect(&addr).with_context(|| format!("connecting to {addr}"))?;
    tcp.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut stream: Box<dyn ReadWrite> = if tls {
        let config = pve::tls::client_config(&trust(pin))?;
        let host = hostport
            .split(':')
            .next()
            .unwrap_or("localhost")
            .to_string();
        let name = rustls::pki_types::ServerName::try_from(host)?;
        let conn = rustls::ClientConnection::new(Arc::new(config), name)?;
        Box::new(rustls::StreamOwned::new(conn, tcp))
    } else {
        Box::new(tcp)
    };
    stream.write_all(req.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()?;
    read_response(stream)
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

fn read_response(stream: Box<dyn ReadWrite>) -> Result<HttpResponse> {
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    r.read_line(&mut line).context("reading the status line")?;
    let mut parts = line.trim_end().splitn(3, ' ');
    let _proto = parts.next();
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .context("no status in the response")?;
    let reason = parts.next().unwrap_or("").to_string();
    let (mut length, mut chunked) = (None, false);
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            match k.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = v.trim().parse::<usize>().ok(),
                "transfer-encoding" => chunked = v.trim().eq_ignore_ascii_case("chunked"),
                _ => {}
            }
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let n = usize::from_str_radix(line.trim().split(';').next().unwrap_or("0"), 16)?;
            if n == 0 {
                break;
            }
            let start = body.len();
            body.resize(start + n, 0);
            r.read_exact(&mut body[start..])?;
            line.clear();
            r.read_line(&mut line)?;
        }
    } else if let Some(n) = length {
        body.resize(n, 0);
        r.read_exact(&mut body)?;
    } else {
        // TLS peers may close without close_notify; what arrived is the body.
        let _ = r.read_to_end(&mut body);
    }
    Ok(HttpResponse {
        status,
        reason,
        body,
    })
}
