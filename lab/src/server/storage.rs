//! `/nodes/{node}/storage/...`: the one storage `local` (type dir) with `vztmpl`, `iso` and
//! `rootdir` content, and `download-url` (checksum verified) from loopback or the lab bridge.

use std::io::Write;

use hyper::Method;
use md5::Md5;
use serde_json::{Value, json};
use sha1::Sha1;
use sha2::{Digest, Sha224, Sha256, Sha384, Sha512};

use crate::error::{ApiError, ApiResult};
use crate::node::Node;

use super::App;
use super::http::Reply;
use super::router::Ctx;

const CONTENT: &str = "iso,rootdir,vztmpl";

/// Routes `rest` (the path below `/nodes/{node}`).
pub fn route(app: &App, ctx: &Ctx, rest: &[&str]) -> Option<ApiResult<Reply>> {
    Some(match (&ctx.method, rest) {
        (&Method::GET, ["storage"]) => list(app),
        (&Method::GET, ["storage", s]) => check_storage(s).map(|_| {
            Reply::data(json!(
                ["content", "download-url", "status"].map(|n| json!({ "subdir": n }))
            ))
        }),
        (&Method::GET, ["storage", s, "content"]) => content(app, ctx, s),
        (&Method::POST, ["storage", s, "download-url"]) => download(app, ctx, s),
        _ => return None,
    })
}

fn check_storage(s: &str) -> ApiResult<()> {
    if s == "local" {
        Ok(())
    } else {
        Err(ApiError::die(format!("storage '{s}' does not exist")))
    }
}

fn statvfs(path: &std::path::Path) -> (u64, u64) {
    let c = std::ffi::CString::new(path.to_string_lossy().as_bytes()).unwrap_or_default();
    // SAFETY: statvfs writes into the zeroed struct it is given.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return (0, 0);
    }
    let f = st.f_frsize;
    (st.f_blocks * f, st.f_bavail * f)
}

fn list(app: &App) -> ApiResult<Reply> {
    let (total, avail) = statvfs(&app.node.lab.dir);
    Ok(Reply::data(json!([{
        "storage": "local", "type": "dir", "content": CONTENT, "active": 1, "enabled": 1, "shared": 0,
        "total": total, "avail": avail, "used": total.saturating_sub(avail),
        "used_fraction": if total > 0 { (total - avail) as f64 / total as f64 } else { 0.0 },
    }])))
}

fn content(app: &App, ctx: &Ctx, s: &str) -> ApiResult<Reply> {
    check_storage(s)?;
    let want = ctx.params.str("content");
    let filter_vmid = ctx.params.int("vmid")?;
    let mut out = Vec::new();
    if want.as_deref().is_none_or(|c| c == "vztmpl") {
        for (volid, size, ctime) in crate::node::volumes::templates(&app.node.lab) {
            out.push(json!({ "volid": volid, "format": template_format(&volid), "size": size, "ctime": ctime, "content": "vztmpl" }));
        }
    }
    if want
        .as_deref()
        .is_none_or(|c| c == "rootdir" || c == "images")
    {
        for vmid in app.node.list() {
            if filter_vmid.is_some_and(|v| v != i64::from(vmid)) {
                continue;
            }
            let dir = app.node.lab.images_dir(vmid);
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                out.push(json!({ "volid": format!("local:{vmid}/{name}"), "format": "raw", "size": 0, "vmid": vmid, "content": "rootdir" }));
            }
        }
    }
    Ok(Reply::data(Value::Array(out)))
}

fn template_format(volid: &str) -> &'static str {
    if volid.ends_with(".tar.zst") {
        "tzst"
    } else if volid.ends_with(".tar.xz") {
        "txz"
    } else {
        "tgz"
    }
}

fn loopback_or_bridge(url: &str, node: &Node) -> bool {
    let rest = url.split_once("://").map_or("", |(_, r)| r);
    let hostport = rest.split('/').next().unwrap_or("");
    let host = hostport.rsplit_once(':').map_or(hostport, |(h, _)| h);
    let bridge = node.lab.bridge_ip().to_string();
    host == "localhost"
        || host == bridge
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn checksum(algo: &str, data: &[u8]) -> ApiResult<String> {
    Ok(match algo {
        "md5" => hex::encode(Md5::digest(data)),
        "sha1" => hex::encode(Sha1::digest(data)),
        "sha224" => hex::encode(Sha224::digest(data)),
        "sha256" => hex::encode(Sha256::digest(data)),
        "sha384" => hex::encode(Sha384::digest(data)),
        "sha512" => hex::encode(Sha512::digest(data)),
        other => {
            return Err(ApiError::param(
                "checksum-algorithm",
                format!(
                    "value '{other}' does not have a value in the enumeration 'md5, sha1, sha224, sha256, sha384, sha512'"
                ),
            ));
        }
    })
}

fn download(app: &App, ctx: &Ctx, s: &str) -> ApiResult<Reply> {
    check_storage(s)?;
    ctx.user.check("/", &["Sys.Modify"])?;
    let p = &ctx.params;
    let url = p
        .str("url")
        .ok_or_else(|| ApiError::param("url", "property is missing and it is not optional"))?;
    let content = p
        .str("content")
        .ok_or_else(|| ApiError::param("content", "property is missing and it is not optional"))?;
    let filename = p
        .str("filename")
        .ok_or_else(|| ApiError::param("filename", "property is missing and it is not optional"))?;
    let sum = p.str("checksum");
    let algo = p.str("checksum-algorithm");
    if sum.is_some() != algo.is_some() {
        let (k, other) = if sum.is_some() {
            ("checksum-algorithm", "checksum")
        } else {
            ("checksum", "checksum-algorithm")
        };
        return Err(ApiError::param(
            k,
            format!("missing property - '{other}' requires this property"),
        ));
    }
    let dir = match content.as_str() {
        "vztmpl" => app.node.lab.template_dir(),
        "iso" => app.node.lab.storage_dir().join("template/iso"),
        other => {
            return Err(ApiError::die(format!(
                "storage 'local' is not configured for content-type '{other}'"
            )));
        }
    };
    let exts: &[&str] = if content == "iso" {
        &[".iso", ".img"]
    } else {
        &[".tar.gz", ".tar.xz", ".tar.zst", ".tgz"]
    };
    let normalised: String = filename
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if !exts.iter().any(|e| normalised.ends_with(e)) || normalised.starts_with('.') {
        return Err(ApiError::param(
            "filename",
            "invalid filename or wrong extension",
        ));
    }
    if !loopback_or_bridge(&url, &app.node) {
        return Err(ApiError::die(format!(
            "lab: refusing to download '{url}' - only loopback and lab bridge addresses are reachable"
        )));
    }
    let verify = p.bool("verify-certificates")?.unwrap_or(true);
    let user = ctx.user.authid();
    let task_id = normalised.clone();
    let upid = std::sync::Arc::clone(&app.tasks).spawn(
        "download",
        &task_id,
        &user,
        ctx.task_fault.clone(),
        None,
        move |log| {
            let dest = dir.join(&normalised);
            log(&format!("downloading {url} to {}", dest.display()));
            // A self-signed loopback server cannot be verified; verification is best effort here.
            let _ = verify;
            let resp = crate::client::request("GET", &url, &[], &[], None)
                .map_err(|e| ApiError::die(format!("download failed: {e:#}")))?;
            if resp.status != 200 {
                return Err(ApiError::die(format!(
                    "download failed: {} {}",
                    resp.status, resp.reason
                )));
            }
            if let (Some(want), Some(algo)) = (&sum, &algo) {
                let got = checksum(algo, &resp.body)?;
                log(&format!("calculating checksum of '{}'...", dest.display()));
                if !got.eq_ignore_ascii_case(want) {
                    return Err(ApiError::die(format!(
                        "checksum mismatch: got '{got}' != expect '{want}'"
                    )));
                }
                log("checksum verified");
            }
            std::fs::create_dir_all(&dir)?;
            let tmp = dir.join(format!(".{normalised}.tmp"));
            std::fs::File::create(&tmp)?.write_all(&resp.body)?;
            std::fs::rename(&tmp, &dest)?;
            log(&format!(
                "download of '{url}' to '{}' finished",
                dest.display()
            ));
            Ok(())
        },
    );
    Ok(Reply::data(json!(upid)))
}
