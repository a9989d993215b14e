//! The one Proxmox API client (reqwest over rustls, trust from [`crate::tls`]), used by
//! provision and by the lab's testkit and tools. Its calls block: the callers are synchronous
//! (provision's engine, test `Drop`s), so the client owns a small runtime and, when called
//! from inside another runtime, runs the request on a scoped thread instead of panicking.

use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::error::ApiError;
use crate::tls::{Trust, client_config};

/// Status the client gives a call that got no HTTP answer (refused, reset, timed out).
pub const NO_ANSWER: u16 = 599;

/// A ticket is valid for two hours; it is renewed well before.
const TICKET_RENEW_AFTER: Duration = Duration::from_secs(100 * 60);

/// How a [`Client`] authenticates.
#[derive(Debug, Clone)]
pub enum Auth {
    /// `USER@REALM!TOKENID=SECRET` (empty: no authentication).
    Token(String),
    /// A ticket and its CSRF token, from `POST /access/ticket`.
    Ticket {
        /// `PVEAuthCookie` value.
        ticket: String,
        /// `CSRFPreventionToken` header.
        csrf: String,
    },
}

/// Which failures are retried, and how long to wait between attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all (1: no retry).
    pub attempts: u32,
    /// The first wait; each next one doubles, up to `max_delay`, plus up to 50% jitter.
    pub base_delay: Duration,
    /// The longest wait.
    pub max_delay: Duration,
}

impl RetryPolicy {
    /// Every call is made once.
    pub const NONE: RetryPolicy = RetryPolicy {
        attempts: 1,
        base_delay: Duration::ZERO,
        max_delay: Duration::ZERO,
    };

    /// What provision uses: 6 attempts over about half a minute, which outlasts a config
    /// lock held by another writer (Proxmox gives up on a lock after 10 s).
    pub const STANDARD: RetryPolicy = RetryPolicy {
        attempts: 6,
        base_delay: Duration::from_millis(500),
        max_delay: Duration::from_secs(8),
    };

    fn delay(&self, attempt: u32) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(1 << attempt.min(16))
            .min(self.max_delay);
        let jitter = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
            % 1000;
        exp + exp.mul_f64(jitter as f64 / 2000.0)
    }
}

/// True for a failure that says nothing happened or may be asked again: 596 (the proxy lost
/// its connection), a config lock that timed out, or no answer at all (reset, refused, timeout).
pub fn is_transient(e: &ApiError) -> bool {
    e.status == 596
        || e.status == NO_ANSWER
        || (e.status == 500 && e.message.contains("got timeout"))
}

/// True for calls that may be sent twice: reads, and writes guarded by `digest` (a second
/// write after a first one that landed fails the digest check instead of writing twice).
pub fn is_retryable(method: &str, params: &[(&str, &str)]) -> bool {
    method == "GET" || params.iter().any(|(k, _)| *k == "digest")
}

/// A runtime that shuts down without blocking, so a client may be dropped anywhere.
struct Runtime(Option<tokio::runtime::Runtime>);

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

struct Login {
    user: String,
    password: String,
    renewed: Mutex<Option<(Auth, Instant)>>,
}

/// A Proxmox API client for one node's `/api2/json`.
pub struct Client {
    /// `https://127.0.0.1:8006/api2/json`.
    pub base: String,
    /// Credentials.
    pub auth: Auth,
    trust: Trust,
    retry: RetryPolicy,
    login: Option<Login>,
    http: reqwest::Client,
    rt: Runtime,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the credentials.
        f.debug_struct("Client").field("base", &self.base).finish()
    }
}

impl Client {
    /// A client for `base` (`.../api2/json`), trusting the node as `trust` says.
    pub fn new(base: &str, trust: Trust, auth: Auth) -> Result<Client, ApiError> {
        Self::with_timeout(base, trust, auth, Duration::from_secs(120))
    }

    /// As [`Client::new`], with a limit on each request.
    pub fn with_timeout(
        base: &str,
        trust: Trust,
        auth: Auth,
        timeout: Duration,
    ) -> Result<Client, ApiError> {
        let tls = client_config(&trust).map_err(|e| ApiError::new(NO_ANSWER, e.to_string()))?;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .connect_timeout(Duration::from_secs(10))
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ApiError::new(NO_ANSWER, format!("HTTP client setup: {e}")))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ApiError::from)?;
        Ok(Client {
            base: base.trim_end_matches('/').to_string(),
            auth,
            trust,
            retry: RetryPolicy::NONE,
            login: None,
            http,
            rt: Runtime(Some(rt)),
        })
    }

    /// Logs in as `user` with a password; the ticket is renewed before it expires.
    pub fn login(base: &str, trust: Trust, user: &str, password: &str) -> Result<Client, ApiError> {
        let mut c = Client::new(base, trust, Auth::Token(String::new()))?;
        c.auth = c.ticket(user, password)?;
        c.login = Some(Login {
            user: user.to_string(),
            password: password.to_string(),
            renewed: Mutex::new(None),
        });
        Ok(c)
    }

    /// Retries transient failures of retryable calls as `policy` says.
    pub fn with_retry(mut self, policy: RetryPolicy) -> Client {
        self.retry = policy;
        self
    }

    /// How this client trusts the node.
    pub fn trust(&self) -> &Trust {
        &self.trust
    }

    fn ticket(&self, user: &str, password: &str) -> Result<Auth, ApiError> {
        let data = self
            .send(
                "POST",
                "/access/ticket",
                &[("username", user), ("password", password)],
                &Auth::Token(String::new()),
            )
            .map_err(|e| ApiError::new(e.status, format!("login failed: {}", e.message)))?;
        let get = |k: &str| {
            data[k]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| ApiError::new(500, format!("no {k} in the login answer")))
        };
        Ok(Auth::Ticket {
            ticket: get("ticket")?,
            csrf: get("CSRFPreventionToken")?,
        })
    }

    /// The credentials to send now: a ticket older than [`TICKET_RENEW_AFTER`] is renewed.
    fn current_auth(&self) -> Result<Auth, ApiError> {
        let Some(login) = &self.login else {
            return Ok(self.auth.clone());
        };
        let mut renewed = login.renewed.lock().unwrap_or_else(|e| e.into_inner());
        let (auth, since) = renewed.get_or_insert_with(|| (self.auth.clone(), Instant::now()));
        if since.elapsed() > TICKET_RENEW_AFTER {
            *auth = self.ticket(&login.user, &login.password)?;
            *since = Instant::now();
        }
        Ok(auth.clone())
    }

    /// Calls the API; returns `data`, or the error as the server reported it. Transient
    /// failures of retryable calls are retried by the client's [`RetryPolicy`].
    pub fn call(
        &self,
        method: &str,
        path: &str,
        params: &[(&str, &str)],
    ) -> Result<Value, ApiError> {
        let auth = self.current_auth()?;
        let mut attempt = 0;
        loop {
            match self.send(method, path, params, &auth) {
                Err(e)
                    if attempt + 1 < self.retry.attempts
                        && is_transient(&e)
                        && is_retryable(method, params) =>
                {
                    std::thread::sleep(self.retry.delay(attempt));
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    fn send(
        &self,
        method: &str,
        path: &str,
        params: &[(&str, &str)],
        auth: &Auth,
    ) -> Result<Value, ApiError> {
        let form: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish();
        let mut url = format!("{}{path}", self.base);
        let body_params = !(method == "GET" || method == "DELETE");
        if !body_params && !form.is_empty() {
            url = format!("{url}?{form}");
        }
        let m = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|_| ApiError::new(400, format!("bad method {method}")))?;
        let mut req = self.http.request(m, &url);
        if body_params {
            req = req
                .header("Content-Type", "application/x-www-form-urlencoded")
                .body(form);
        }
        match auth {
            Auth::Token(t) if !t.is_empty() => {
                req = req.header("Authorization", format!("PVEAPIToken={t}"));
            }
            Auth::Ticket { ticket, csrf } => {
                req = req
                    .header("Cookie", format!("PVEAuthCookie={ticket}"))
                    .header("CSRFPreventionToken", csrf.as_str());
            }
            Auth::Token(_) => {}
        }
        let fut = async move {
            let resp = req.send().await.map_err(no_answer)?;
            let status = resp.status().as_u16();
            let reason = resp
                .extensions()
                .get::<hyper::ext::ReasonPhrase>()
                .map(|r| String::from_utf8_lossy(r.as_bytes()).into_owned())
                .or_else(|| resp.status().canonical_reason().map(str::to_string))
                .unwrap_or_default();
            let body = resp.bytes().await.map_err(no_answer)?;
            Ok::<_, ApiError>((status, reason, body))
        };
        let (status, reason, body) = self.block_on(fut)?;
        let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if status >= 400 {
            let message = json
                .get("message")
                .and_then(Value::as_str)
                .map(|m| m.trim_end().to_string())
                .filter(|m| !m.is_empty())
                .unwrap_or(reason);
            let mut err = ApiError::new(status, message);
            if let Some(obj) = json.get("errors").and_then(Value::as_object) {
                err.errors = obj
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").trim_end().to_string()))
                    .collect();
            }
            return Err(err);
        }
        Ok(json.get("data").cloned().unwrap_or(Value::Null))
    }

    fn block_on<F: std::future::Future + Send>(&self, fut: F) -> F::Output
    where
        F::Output: Send,
    {
        let rt = self
            .rt
            .0
            .as_ref()
            .expect("runtime lives as long as the client");
        if tokio::runtime::Handle::try_current().is_ok() {
            // Inside another runtime (an async test): block a thread of our own instead.
            std::thread::scope(|s| {
                s.spawn(|| rt.block_on(fut))
                    .join()
                    .expect("request thread does not panic")
            })
        } else {
            rt.block_on(fut)
        }
    }

    /// Polls a task until it stops; returns its `exitstatus`.
    pub fn wait_task(&self, node: &str, upid: &str, timeout: Duration) -> Result<String, ApiError> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(25);
        loop {
            let st = self.call("GET", &format!("/nodes/{node}/tasks/{upid}/status"), &[])?;
            if st["status"] == "stopped" {
                return Ok(st["exitstatus"].as_str().unwrap_or("").to_string());
            }
            if Instant::now() > deadline {
                return Err(ApiError::new(
                    NO_ANSWER,
                    format!("task {upid} still running after {timeout:?}"),
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }
}

/// A request that got no HTTP answer; the chain of causes says why (refused, reset, TLS).
fn no_answer(e: reqwest::Error) -> ApiError {
    let mut msg = if e.is_timeout() {
        "timed out".to_string()
    } else {
        e.to_string()
    };
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        src = s.source();
    }
    ApiError::new(NO_ANSWER, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reads_and_digest_guarded_writes_are_retried() {
        assert!(is_retryable("GET", &[]));
        assert!(is_retryable(
            "PUT",
            &[("memory", "1024"), ("digest", "abc")]
        ));
        assert!(!is_retryable("PUT", &[("memory", "1024")]));
        assert!(!is_retryable("POST", &[("vmid", "100")]));
    }

    #[test]
    fn transient_failures() {
        assert!(is_transient(&ApiError::new(596, "Broken pipe")));
        assert!(is_transient(&ApiError::new(
            500,
            "can't lock file '/run/lock/lxc/pve-config-100.lock' - got timeout"
        )));
        assert!(!is_transient(&ApiError::new(500, "CT 100 already running")));
        assert!(!is_transient(&ApiError::new(401, "authentication failure")));
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy::STANDARD;
        assert!(
            p.delay(0) >= Duration::from_millis(500) && p.delay(0) <= Duration::from_millis(750)
        );
        assert!(p.delay(10) <= Duration::from_secs(12));
    }
}
