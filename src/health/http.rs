//! The agent's short-GET client: reqwest on a small tokio runtime of its own, since the
//! agent's loop is synchronous. The health gate asks `http://` URLs on the target itself
//! (the readiness URL and `/health` next to it); an APT source's key is fetched with it
//! too (a small file, pinned by fingerprint).

use std::time::Duration;

/// Why a GET got no answer.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The runtime or the client could not be built.
    #[error("cannot start an HTTP client: {0}")]
    Client(String),
    /// No connection, a timeout, or a broken answer.
    #[error("GET {url}: {reason}")]
    Get {
        /// The URL asked.
        url: String,
        /// What went wrong.
        reason: String,
    },
}

/// A reusable client for short GETs.
pub struct HttpClient {
    runtime: tokio::runtime::Runtime,
    client: reqwest::Client,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpClient")
    }
}

impl HttpClient {
    /// A client whose every request ends within `timeout`.
    pub fn new(timeout: Duration) -> Result<Self, HttpError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| HttpError::Client(e.to_string()))?;
        crate::hub::install_crypto_provider();
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            // Readiness is judged on this machine; a proxy from the environment must not
            // answer for the server.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| HttpError::Client(crate::hub::client_error(&e)))?;
        Ok(HttpClient { runtime, client })
    }

    /// GETs `url`: its status and body (the body capped at 4 MiB).
    pub fn get(&self, url: &str) -> Result<(u16, String), HttpError> {
        self.get_bytes(url)
            .map(|(s, b)| (s, String::from_utf8_lossy(&b).into_owned()))
    }

    /// GETs `url`: its status and body as bytes (capped at 4 MiB).
    pub fn get_bytes(&self, url: &str) -> Result<(u16, Vec<u8>), HttpError> {
        let fail = |e: reqwest::Error| HttpError::Get {
            url: url.to_string(),
            reason: crate::diagnostic::one_line(&e),
        };
        self.runtime.block_on(async {
            let mut resp = self
                .client
                .get(url)
                .header(reqwest::header::ACCEPT, "application/json")
                .send()
                .await
                .map_err(fail)?;
            let status = resp.status().as_u16();
            let mut body = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(fail)? {
                body.extend_from_slice(&chunk);
                if body.len() > 4 * 1024 * 1024 {
                    break;
                }
            }
            Ok((status, body))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    /// A one-shot server that reads the whole request head before answering, so the
    /// client never sees a reset for bytes the server left unread.
    fn serve_once(answer: &'static [u8]) -> (u16, std::thread::JoinHandle<String>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "the client closed before the end of its request");
                head.extend_from_slice(&buf[..n]);
            }
            s.write_all(answer).unwrap();
            s.flush().unwrap();
            String::from_utf8_lossy(&head).into_owned()
        });
        (port, server)
    }

    #[test]
    fn status_and_body_from_a_real_listener() {
        let (port, server) =
            serve_once(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\nno");
        let client = HttpClient::new(Duration::from_secs(30)).unwrap();
        let got = client
            .get(&format!("http://127.0.0.1:{port}/health"))
            .unwrap();
        assert_eq!(got, (503, "no".to_string()));
        let head = server.join().unwrap();
        assert!(head.starts_with("GET /health HTTP/1.1\r\n"), "{head}");
    }

    #[test]
    fn a_closed_port_is_an_error_naming_the_url() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let client = HttpClient::new(Duration::from_secs(30)).unwrap();
        let url = format!("http://127.0.0.1:{port}/v1/models");
        let err = client.get(&url).unwrap_err().to_string();
        assert!(err.starts_with(&format!("GET {url}: ")), "{err}");
    }
}
