//! The HTTP side: routing, the hub's headers and errors, ranges, and the generated body with
//! its faults.

use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, RANGE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;

use crate::body::{GenBody, HubBody};
use crate::content::{self, FileHashes, RepoSpec};
use crate::{Fault, FaultKind, Stats};

/// A repository with what is computed once at start.
pub(crate) struct Repo {
    pub spec: RepoSpec,
    pub commit: String,
    pub hashes: Vec<FileHashes>,
    seeds: Vec<u64>,
}

/// Shared by every connection.
pub(crate) struct State {
    pub repos: Vec<Repo>,
    pub token: Option<String>,
    pub page_size: usize,
    pub endpoint: String,
    pub cdn: Option<String>,
    pub faults: Mutex<Vec<Fault>>,
    pub stats: Arc<Mutex<Stats>>,
}

impl State {
    pub fn repo(&self, id: &str) -> Option<&Repo> {
        self.repos.iter().find(|r| r.spec.id == id)
    }

    fn stat(&self, f: impl FnOnce(&mut Stats)) {
        f(&mut self.stats.lock().expect("stats"));
    }

    /// Takes the faults that apply to one content response, counting their uses.
    fn take_faults(&self, path: &str, covers: impl Fn(&FaultKind) -> bool) -> Vec<FaultKind> {
        let mut faults = self.faults.lock().expect("faults");
        let mut out = Vec::new();
        for f in faults.iter_mut() {
            let matches = f.path.as_deref().is_none_or(|p| p == path);
            if matches && f.times != Some(0) && covers(&f.kind) {
                if let Some(t) = f.times.as_mut() {
                    *t -= 1;
                }
                out.push(f.kind.clone());
            }
        }
        out
    }
}

/// Which port a connection came in on.
#[derive(Clone, Copy)]
pub(crate) enum Port {
    Hub,
    Cdn,
}

/// Computes every file's hashes, large files on all cores.
pub(crate) fn prepare(specs: &[RepoSpec], cache: Option<&Path>) -> Vec<Repo> {
    specs
        .iter()
        .map(|spec| {
            // A file given as text is as long as its text.
            let mut spec = spec.clone();
            for f in &mut spec.files {
                if let Some(text) = &f.content {
                    f.size = text.len() as u64;
                }
            }
            let spec = &spec;
            let hashes = std::thread::scope(|s| {
                let handles: Vec<_> = spec
                    .files
                    .iter()
                    .map(|f| s.spawn(move || content::hashes(&spec.id, f, cache)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("hash thread"))
                    .collect()
            });
            Repo {
                commit: spec.commit(),
                seeds: spec
                    .files
                    .iter()
                    .map(|f| content::seed(&spec.id, &f.path))
                    .collect(),
                hashes,
                spec: spec.clone(),
            }
        })
        .collect()
}

/// Accepts connections until the runtime stops.
pub(crate) async fn serve(listener: tokio::net::TcpListener, state: Arc<State>, port: Port) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(route(&state, port, req).await) }
            });
            // A client that hangs up mid-body is normal here (faults, kill -9 tests).
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

type Resp = Response<HubBody>;

async fn route(state: &State, port: Port, req: Request<Incoming>) -> Resp {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    match port {
        Port::Cdn => cdn(state, &req, &path),
        Port::Hub => {
            if let Some(rest) = path.strip_prefix("/_fakehub/") {
                return admin(state, req, rest).await;
            }
            if let Some(rest) = path.strip_prefix("/api/models/") {
                if let Some((repo, rev)) = rest.split_once("/revision/") {
                    return revision(state, &req, repo, &decode(rev));
                }
                if let Some((repo, rest)) = rest.split_once("/tree/") {
                    return tree(state, &req, repo, rest, &query);
                }
            }
            if let Some((repo, rest)) = path.trim_start_matches('/').split_once("/resolve/") {
                return resolve(state, &req, repo, rest);
            }
            error(StatusCode::NOT_FOUND, None, "no such endpoint")
        }
    }
}

fn error(status: StatusCode, code: Option<&str>, message: &str) -> Resp {
    let mut r = Response::builder()
        .status(status)
        .header("Content-Type", "application/json")
        .header("X-Error-Message", message);
    if let Some(code) = code {
        r = r.header("X-Error-Code", code);
    }
    r.body(HubBody::full(json!({ "error": message }).to_string()))
        .expect("response")
}

fn json_response(value: serde_json::Value) -> Resp {
    Response::builder()
        .header("Content-Type", "application/json")
        .body(HubBody::full(value.to_string()))
        .expect("response")
}

fn authorized(state: &State, req: &Request<Incoming>) -> Option<bool> {
    let header = req.headers().get("authorization")?.to_str().ok()?;
    let given = header.strip_prefix("Bearer ")?;
    Some(state.token.as_deref() == Some(given))
}

/// Finds the repo, or the error the real hub gives (401 when anonymous, 404 when not).
fn find_repo<'a>(
    state: &'a State,
    req: &Request<Incoming>,
    id: &str,
) -> Result<&'a Repo, Box<Resp>> {
    match state.repo(id) {
        Some(r) => Ok(r),
        None => {
            let status = if authorized(state, req).is_some() {
                StatusCode::NOT_FOUND
            } else {
                StatusCode::UNAUTHORIZED
            };
            Err(Box::new(error(
                status,
                Some("RepoNotFound"),
                "Repository not found",
            )))
        }
    }
}

fn resolve_rev<'a>(repo: &'a Repo, rev: &str) -> Result<&'a str, Box<Resp>> {
    if rev == repo.commit || repo.spec.refs.iter().any(|r| r == rev) {
        Ok(&repo.commit)
    } else {
        Err(Box::new(error(
            StatusCode::NOT_FOUND,
            Some("RevisionNotFound"),
            &format!("Invalid rev id: {rev}"),
        )))
    }
}

fn revision(state: &State, req: &Request<Incoming>, repo: &str, rev: &str) -> Resp {
    state.stat(|s| s.revision_requests += 1);
    let repo = match find_repo(state, req, repo) {
        Ok(r) => r,
        Err(e) => return *e,
    };
    let commit = match resolve_rev(repo, rev) {
        Ok(c) => c,
        Err(e) => return *e,
    };
    let siblings: Vec<_> = repo
        .spec
        .files
        .iter()
        .map(|f| json!({ "rfilename": f.path }))
        .collect();
    json_response(json!({
        "_id": &commit[..24],
        "id": repo.spec.id,
        "modelId": repo.spec.id,
        "sha": commit,
        "private": false,
        "disabled": false,
        "gated": if repo.spec.gated { json!("manual") } else { json!(false) },
        "lastModified": "2026-01-01T00:00:00.000Z",
        "tags": [],
        "siblings": siblings,
    }))
}

fn tree(state: &State, req: &Request<Incoming>, repo: &str, rest: &str, query: &str) -> Resp {
    state.stat(|s| s.tree_requests += 1);
    let repo_id = repo;
    let repo = match find_repo(state, req, repo) {
        Ok(r) => r,
        Err(e) => return *e,
    };
    let (rev, dir) = match rest.split_once('/') {
        Some((rev, dir)) => (decode(rev), decode(dir)),
        None => (decode(rest), String::new()),
    };
    if let Err(e) = resolve_rev(repo, &rev) {
        return *e;
    }
    let params: Vec<(&str, &str)> = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let recursive = params
        .iter()
        .any(|(k, v)| *k == "recursive" && matches!(*v, "true" | "True" | "1"));
    let cursor: usize = params
        .iter()
        .find(|(k, _)| *k == "cursor")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let entries = listing(repo, &dir, recursive);
    if !dir.is_empty() && entries.is_empty() {
        return error(
            StatusCode::NOT_FOUND,
            Some("EntryNotFound"),
            &format!("{dir} does not exist on \"{rev}\""),
        );
    }
    let end = (cursor + state.page_size).min(entries.len());
    let page: Vec<_> = entries.get(cursor..end).unwrap_or(&[]).to_vec();
    let mut r = Response::builder().header("Content-Type", "application/json");
    if end < entries.len() {
        let keep: Vec<String> = params
            .iter()
            .filter(|(k, _)| *k != "cursor")
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let mut q = keep.join("&");
        if !q.is_empty() {
            q.push('&');
        }
        let link = format!(
            "<{}/api/models/{repo_id}/tree/{rest}?{q}cursor={end}>; rel=\"next\"",
            state.endpoint
        );
        r = r.header("Link", link);
    }
    r.body(HubBody::full(serde_json::Value::Array(page).to_string()))
        .expect("response")
}

/// Tree entries under `dir`: folders first at each level, as the hub lists them.
fn listing(repo: &Repo, dir: &str, recursive: bool) -> Vec<serde_json::Value> {
    let prefix = if dir.is_empty() {
        String::new()
    } else {
        format!("{}/", dir.trim_end_matches('/'))
    };
    let mut dirs = std::collections::BTreeSet::new();
    let mut files = Vec::new();
    for (f, h) in repo.spec.files.iter().zip(&repo.hashes) {
        let Some(rel) = f.path.strip_prefix(&prefix) else {
            continue;
        };
        let parts: Vec<&str> = rel.split('/').collect();
        for i in 1..parts.len() {
            if recursive || i == 1 {
                dirs.insert(format!("{prefix}{}", parts[..i].join("/")));
            }
        }
        if recursive || parts.len() == 1 {
            let mut e = json!({ "type": "file", "oid": h.git_oid, "size": f.size, "path": f.path });
            if f.lfs {
                e["lfs"] =
                    json!({ "oid": h.sha256, "size": f.size, "pointerSize": h.pointer_size });
            }
            files.push(e);
        }
    }
    let mut out: Vec<_> = dirs
        .into_iter()
        .map(|d| {
            let oid = content::git_blob_sha1(d.as_bytes());
            json!({ "type": "directory", "oid": oid, "size": 0, "path": d })
        })
        .collect();
    out.extend(files);
    out
}

fn resolve(state: &State, req: &Request<Incoming>, repo: &str, rest: &str) -> Resp {
    let head = req.method() == Method::HEAD;
    state.stat(|s| {
        if head {
            s.resolve_head += 1
        } else {
            s.resolve_get += 1
        }
    });
    let repo = match find_repo(state, req, repo) {
        Ok(r) => r,
        Err(e) => return *e,
    };
    let Some((rev, path)) = rest.split_once('/') else {
        return error(StatusCode::NOT_FOUND, Some("EntryNotFound"), "no file");
    };
    let commit = match resolve_rev(repo, &decode(rev)) {
        Ok(c) => c.to_string(),
        Err(e) => return *e,
    };
    if repo.spec.gated {
        match authorized(state, req) {
            Some(true) => {}
            Some(false) => {
                return error(
                    StatusCode::FORBIDDEN,
                    Some("GatedRepo"),
                    &format!(
                        "Access to model {} is restricted and you are not in the authorized list.",
                        repo.spec.id
                    ),
                );
            }
            None => {
                return error(
                    StatusCode::UNAUTHORIZED,
                    Some("GatedRepo"),
                    &format!(
                        "Access to model {} is restricted. You must have access to it and be authenticated to access it. Please log in.",
                        repo.spec.id
                    ),
                );
            }
        }
    }
    let path = decode(path);
    let Some(index) = repo.spec.files.iter().position(|f| f.path == path) else {
        let mut r = error(
            StatusCode::NOT_FOUND,
            Some("EntryNotFound"),
            &format!("{path} does not exist on \"{commit}\""),
        );
        r.headers_mut().insert(
            "X-Repo-Commit",
            HeaderValue::from_str(&commit).expect("hex"),
        );
        return r;
    };
    let file = &repo.spec.files[index];
    let h = &repo.hashes[index];
    if file.lfs
        && let Some(cdn) = &state.cdn
    {
        let ri = state
            .repos
            .iter()
            .position(|r| r.spec.id == repo.spec.id)
            .expect("repo");
        let location = format!(
            "{cdn}/repos/{ri}/{index}/{}?Expires=4102444800&Signature=fake",
            h.sha256
        );
        return Response::builder()
            .status(StatusCode::FOUND)
            .header("Location", location)
            .header("X-Repo-Commit", &commit)
            .header("ETag", format!("\"{}\"", h.git_oid))
            .header("X-Linked-Etag", format!("\"{}\"", h.sha256))
            .header("X-Linked-Size", file.size.to_string())
            .header("Content-Length", "0")
            .body(HubBody::empty())
            .expect("response");
    }
    let etag = if file.lfs { &h.sha256 } else { &h.git_oid };
    let mut r = content_response(state, req, repo, index);
    let headers = r.headers_mut();
    headers.insert(
        "X-Repo-Commit",
        HeaderValue::from_str(&commit).expect("hex"),
    );
    headers.insert(
        "ETag",
        HeaderValue::from_str(&format!("\"{etag}\"")).expect("hex"),
    );
    r
}

fn cdn(state: &State, req: &Request<Incoming>, path: &str) -> Resp {
    if req.headers().contains_key("authorization") {
        state.stat(|s| s.auth_on_cdn += 1);
        // What a signed-URL store answers when a bearer token comes along too.
        return error(
            StatusCode::BAD_REQUEST,
            None,
            "Only one auth mechanism allowed",
        );
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let found = match parts.as_slice() {
        ["repos", ri, fi, _] => ri
            .parse::<usize>()
            .ok()
            .zip(fi.parse::<usize>().ok())
            .and_then(|(ri, fi)| state.repos.get(ri).map(|r| (r, fi)))
            .filter(|(r, fi)| *fi < r.spec.files.len()),
        _ => None,
    };
    let Some((repo, index)) = found else {
        return error(StatusCode::NOT_FOUND, None, "NoSuchKey");
    };
    let mut r = content_response(state, req, repo, index);
    let etag = format!("\"{}\"", repo.hashes[index].sha256);
    r.headers_mut()
        .insert("ETag", HeaderValue::from_str(&etag).expect("hex"));
    r
}

/// Parses `bytes=a-b`, `bytes=a-` and `bytes=-n` into an inclusive range, `Err` when
/// unsatisfiable.
fn parse_range(header: &str, size: u64) -> Option<Result<(u64, u64), ()>> {
    let spec = header.trim().strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let range = if a.is_empty() {
        let n: u64 = b.parse().ok()?;
        if n == 0 {
            return Some(Err(()));
        }
        (size.saturating_sub(n), size.checked_sub(1)?)
    } else {
        let start: u64 = a.parse().ok()?;
        let end = if b.is_empty() {
            size.saturating_sub(1)
        } else {
            b.parse::<u64>().ok()?.min(size.saturating_sub(1))
        };
        (start, end)
    };
    if range.0 >= size || range.0 > range.1 {
        return Some(Err(()));
    }
    Some(Ok(range))
}

fn content_response(state: &State, req: &Request<Incoming>, repo: &Repo, index: usize) -> Resp {
    let file = &repo.spec.files[index];
    let head = req.method() == Method::HEAD;
    let range_header = req.headers().get(RANGE).and_then(|v| v.to_str().ok());
    let range = range_header.and_then(|h| parse_range(h, file.size));
    let key = format!("{}/{}", repo.spec.id, file.path);
    if !head {
        state.stat(|s| {
            s.content_requests += 1;
            if range_header.is_some() {
                s.range_requests += 1;
            }
        });
    }
    let (start, end) = match range {
        Some(Ok((a, b))) => (a, b + 1),
        Some(Err(())) => {
            return Response::builder()
                .status(StatusCode::RANGE_NOT_SATISFIABLE)
                .header("Content-Range", format!("bytes */{}", file.size))
                .body(HubBody::empty())
                .expect("response");
        }
        None => (0, file.size),
    };
    let faults = if head {
        Vec::new()
    } else {
        state.take_faults(&file.path, |k| match k {
            FaultKind::Corrupt { offset } => (start..end).contains(offset),
            FaultKind::StallFrom { offset } => *offset < end,
            FaultKind::IgnoreRange => range.is_some(),
            _ => true,
        })
    };
    if let Some(code) = faults.iter().find_map(|k| match k {
        FaultKind::Status { code } => Some(*code),
        _ => None,
    }) {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return error(status, None, "injected failure");
    }
    let (start, end, partial) = if faults.contains(&FaultKind::IgnoreRange) || range.is_none() {
        (0, file.size, false)
    } else {
        (start, end, true)
    };
    let mut body = GenBody {
        seed: repo.seeds[index],
        literal: file.literal().map(Arc::from),
        pos: start,
        end,
        reset_at: None,
        stall_at: None,
        corrupt_at: None,
        rate: None,
        sleep: None,
        key,
        stats: state.stats.clone(),
    };
    for f in &faults {
        match f {
            FaultKind::Reset { after } => body.reset_at = Some(start + after),
            FaultKind::Stall { after } => body.stall_at = Some(start + after),
            FaultKind::StallFrom { offset } => body.stall_at = Some(start.max(*offset)),
            FaultKind::Corrupt { offset } => body.corrupt_at = Some(*offset),
            FaultKind::Slow { bytes_per_sec } => body.rate = Some((*bytes_per_sec).max(1)),
            FaultKind::Status { .. } | FaultKind::IgnoreRange => {}
        }
    }
    let mut r = Response::builder()
        .header("Content-Type", "application/octet-stream")
        .header("Accept-Ranges", "bytes")
        .header("Content-Length", (end - start).to_string());
    if partial {
        r = r.status(StatusCode::PARTIAL_CONTENT).header(
            "Content-Range",
            format!("bytes {start}-{}/{}", end - 1, file.size),
        );
    }
    let body = if head || start == end {
        HubBody::empty()
    } else {
        HubBody::Gen(Box::new(body))
    };
    r.body(body).expect("response")
}

async fn admin(state: &State, req: Request<Incoming>, rest: &str) -> Resp {
    match (req.method().clone(), rest) {
        (Method::GET, "stats") => {
            json_response(serde_json::to_value(&*state.stats.lock().expect("stats")).expect("json"))
        }
        (Method::POST, "stats/reset") => {
            *state.stats.lock().expect("stats") = Stats::default();
            json_response(json!({}))
        }
        (Method::DELETE, "faults") => {
            state.faults.lock().expect("faults").clear();
            json_response(json!({}))
        }
        (Method::POST, "faults") => {
            let Ok(body) = req.into_body().collect().await else {
                return error(StatusCode::BAD_REQUEST, None, "unreadable body");
            };
            match serde_json::from_slice::<Fault>(&body.to_bytes()) {
                Ok(f) => {
                    state.faults.lock().expect("faults").push(f);
                    json_response(json!({}))
                }
                Err(e) => error(StatusCode::BAD_REQUEST, None, &e.to_string()),
            }
        }
        _ => error(StatusCode::NOT_FOUND, None, "no such admin endpoint"),
    }
}

/// Percent-decoding for path segments (`refs%2Fpr%2F1`, `a%20b.bin`).
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
