//! A small blocking HTTP/1.1 client (plain or TLS pinned to a SHA-256 fingerprint), enough for
//! the testkit, `pve-lab fault`, `lab up`'s readiness check and `download-url`. Blocking on
//! purpose: the testkit's `Drop` must work inside and outside an async runtime.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::ApiError;

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

#[derive(Debug)]
struct PinnedVerifier {
    fingerprint: Option<String>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let fp = fingerprint(end_entity.as_ref());
        match &self.fingerprint {
            Some(want) if !want.eq_ignore_ascii_case(&fp) => Err(rustls::Error::General(format!(
                "certificate fingerprint {fp} is not the pinned {want}"
            ))),
            _ => Ok(rustls::client::danger::ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// SHA-256 fingerprint as Proxmox prints it (`AB:CD:...`).
pub fn fingerprint(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
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
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = PinnedVerifier {
            fingerprint: pin.map(str::to_string),
            provider: provider.clone(),
        };
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth();
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

/// How a [`PveClient`] authenticates.
#[derive(Debug, Clone)]
pub enum Auth {
    /// `USER@REALM!TOKENID=SECRET`.
    Token(String),
    /// A ticket and its CSRF token, from `POST /access/ticket`.
    Ticket {
        /// `PVEAuthCookie` value.
        ticket: String,
        /// `CSRFPreventionToken` header.
        csrf: String,
    },
}

/// A Proxmox API client over [`request`].
#[derive(Debug, Clone)]
pub struct PveClient {
    /// `https://127.0.0.1:8006/api2/json`.
    pub base: String,
    /// Pinned certificate fingerprint.
    pub fingerprint: Option<String>,
    /// Credentials.
    pub auth: Auth,
}

impl PveClient {
    /// Logs in as `user` with a password and returns a ticket-authenticated client.
    pub fn login(
        base: &str,
        fingerprint: Option<&str>,
        user: &str,
        password: &str,
    ) -> Result<PveClient> {
        let mut c = PveClient {
            base: base.to_string(),
            fingerprint: fingerprint.map(str::to_string),
            auth: Auth::Token(String::new()),
        };
        let data = c
            .call(
                "POST",
                "/access/ticket",
                &[("username", user), ("password", password)],
            )
            .map_err(|e| anyhow::anyhow!("login failed: {e}"))?;
        let get = |k: &str| {
            data[k]
                .as_str()
                .map(str::to_string)
                .with_context(|| format!("no {k} in the login answer"))
        };
        c.auth = Auth::Ticket {
            ticket: get("ticket")?,
            csrf: get("CSRFPreventionToken")?,
        };
        Ok(c)
    }

    /// Calls the API; returns `data`, or the error as the server reported it.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        params: &[(&str, &str)],
    ) -> Result<Value, ApiError> {
        let form: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish();
        let mut url = format!("{}{path}", self.base);
        let mut body = Vec::new();
        let mut headers = Vec::new();
        if method == "GET" || method == "DELETE" {
            if !form.is_empty() {
                url = format!("{url}?{form}");
            }
        } else {
            body = form.into_bytes();
            headers.push((
                "Content-Type",
                "application/x-www-form-urlencoded".to_string(),
            ));
        }
        match &self.auth {
            Auth::Token(t) if !t.is_empty() => {
                headers.push(("Authorization", format!("PVEAPIToken={t}")))
            }
            Auth::Ticket { ticket, csrf } => {
                headers.push(("Cookie", format!("PVEAuthCookie={ticket}")));
                headers.push(("CSRFPreventionToken", csrf.clone()));
            }
            Auth::Token(_) => {}
        }
        let resp = request(method, &url, &headers, &body, self.fingerprint.as_deref())
            .map_err(|e| ApiError::new(599, format!("{e:#}")))?;
        let json: Value = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
        if resp.status >= 400 {
            let mut err = ApiError::new(resp.status, resp.reason.clone());
            if let Some(obj) = json.get("errors").and_then(Value::as_object) {
                err.errors = obj
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                    .collect();
            }
            return Err(err);
        }
        Ok(json.get("data").cloned().unwrap_or(Value::Null))
    }

    /// Polls a task until it stops; returns its `exitstatus`.
    pub fn wait_task(&self, node: &str, upid: &str, timeout: Duration) -> Result<String, ApiError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let st = self.call("GET", &format!("/nodes/{node}/tasks/{upid}/status"), &[])?;
            if st["status"] == "stopped" {
                return Ok(st["exitstatus"].as_str().unwrap_or("").to_string());
            }
            if std::time::Instant::now() > deadline {
                return Err(ApiError::new(
                    599,
                    format!("task {upid} still running after {timeout:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
