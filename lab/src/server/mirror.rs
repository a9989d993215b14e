//! The static mirror on the bridge address: files under `LAB_MIRROR_DIR` over plain HTTP, with
//! directory listings (enough for a flat apt repository, a pip `--find-links` wheelhouse and
//! git's dumb HTTP protocol), since lab containers reach nothing else.

use std::path::{Component, Path, PathBuf};

use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::http::Body;

/// Serves `root` on `listener` forever.
pub async fn serve(listener: TcpListener, root: PathBuf) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let root = root.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let root = root.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(&root, &req).await) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}

fn status(code: StatusCode, text: &str) -> Response<Body> {
    Response::builder()
        .status(code)
        .body(Body::new(Bytes::from(format!("{text}\n"))))
        .expect("valid response")
}

/// The file a URL path names, refusing anything that climbs out of `root`.
fn resolve(root: &Path, url_path: &str) -> Option<PathBuf> {
    let decoded: String =
        form_urlencoded::parse(format!("p={}", url_path.replace('+', "%2B")).as_bytes())
            .next()?
            .1
            .into_owned();
    let rel = Path::new(decoded.trim_start_matches('/'));
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    Some(root.join(rel))
}

async fn answer(root: &Path, req: &Request<Incoming>) -> Response<Body> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return status(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    }
    let Some(path) = resolve(root, req.uri().path()) else {
        return status(StatusCode::BAD_REQUEST, "bad path");
    };
    let head = req.method() == Method::HEAD;
    let meta = match tokio::fs::metadata(&path).await {
        Ok(m) => m,
        Err(_) => return status(StatusCode::NOT_FOUND, "not found"),
    };
    if meta.is_dir() {
        if !req.uri().path().ends_with('/') {
            return Response::builder()
                .status(StatusCode::MOVED_PERMANENTLY)
                .header("location", format!("{}/", req.uri().path()))
                .body(Body::default())
                .expect("valid response");
        }
        let mut names = Vec::new();
        if let Ok(mut rd) = tokio::fs::read_dir(&path).await {
            while let Ok(Some(e)) = rd.next_entry().await {
                let dir = e.file_type().await.is_ok_and(|t| t.is_dir());
                names.push(format!(
                    "{}{}",
                    e.file_name().to_string_lossy(),
                    if dir { "/" } else { "" }
                ));
            }
        }
        names.sort();
        let links: String = names
            .iter()
            .map(|n| format!("<a href=\"{n}\">{n}</a><br>\n"))
            .collect();
        let html = format!("<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n");
        return Response::builder()
            .header("content-type", "text/html; charset=utf-8")
            .body(Body::new(if head {
                Bytes::new()
            } else {
                Bytes::from(html)
            }))
            .expect("valid response");
    }
    let data = if head {
        Vec::new()
    } else {
        match tokio::fs::read(&path).await {
            Ok(d) => d,
            Err(_) => return status(StatusCode::FORBIDDEN, "unreadable"),
        }
    };
    Response::builder()
        .header("content-length", meta.len())
        .header("content-type", "application/octet-stream")
        .body(Body::new(Bytes::from(data)))
        .expect("valid response")
}
