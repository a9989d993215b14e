//! One request: envelope, authentication, injected faults, schema check, dispatch to the
//! handler of its API area, and the response checked against the schema's `returns`.

use std::sync::Arc;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult};
use crate::pve::perms::AuthUser;

use super::App;
use super::faults::{Fault, FaultRule};
use super::http::{Body, Params, Reply, respond};
use super::tasks::TaskFault;

/// Returned instead of a response to close the connection (the `drop` fault).
#[derive(Debug)]
pub struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped on request")
    }
}

impl std::error::Error for Dropped {}

/// What a handler gets besides the app.
pub struct Ctx {
    /// Method.
    pub method: Method,
    /// Path segments below `/api2/json`.
    pub segs: Vec<String>,
    /// Parameters, path parameters included.
    pub params: Params,
    /// The caller.
    pub user: AuthUser,
    /// A fault to put into the task this call starts.
    pub task_fault: Option<TaskFault>,
}

/// Handles one HTTP request.
pub async fn handle(app: Arc<App>, req: Request<Incoming>) -> Result<Response<Body>, Dropped> {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Err(Dropped),
    };
    let path = parts.uri.path().to_string();
    let Some(rel) = path.strip_prefix("/api2/json") else {
        return Ok(respond(Err(ApiError::new(
            501,
            format!("Unsupported format '{path}'"),
        ))));
    };
    let rel = if rel.is_empty() {
        "/".to_string()
    } else {
        rel.to_string()
    };
    let segs: Vec<String> = rel
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| {
            form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        })
        .collect();
    let ctype = parts
        .headers
        .get("content-type")
        .and_then(|h| h.to_str().ok());
    let params = match Params::parse(parts.uri.query(), ctype, &body) {
        Ok(p) => p,
        Err(e) => return Ok(respond(Err(e))),
    };
    let method = parts.method.clone();
    let is_write = method != Method::GET;

    if method == Method::POST && segs == ["access", "ticket"] {
        let p = &params;
        let r = super::auth::login(
            &app.secrets,
            p.str("username").as_deref(),
            p.str("password").as_deref(),
            p.str("realm").as_deref(),
        )
        .map(Reply::data);
        return Ok(respond(r));
    }
    let user = match super::auth::authenticate(&app.secrets, &parts.headers, is_write) {
        Ok(u) => u,
        Err(e) => return Ok(respond(Err(e))),
    };
    let private = segs.first().map(String::as_str) == Some("lab");
    let mut task_fault = None;
    if !private
        && let Some((fault, delay)) =
            app.faults
                .take(method.as_str(), &rel, &params.0, &app.node.lab.lock_dir)
    {
        tokio::time::sleep(delay).await;
        match fault {
            Fault::Drop => return Err(Dropped),
            Fault::Respond(e) => return Ok(respond(Err(e))),
            Fault::Task(t) => task_fault = Some(t),
            Fault::Pass => {}
        }
    }
    let mut ctx = Ctx {
        method,
        segs,
        params,
        user,
        task_fault,
    };
    let seg_refs: Vec<&str> = ctx.segs.iter().map(String::as_str).collect();
    let schema_info = match (&*app.schema, private) {
        (Ok(schema), false) => match schema.method(&seg_refs, ctx.method.as_str()) {
            Some((tmpl, info)) => {
                add_path_params(&tmpl, &seg_refs, &mut ctx.params);
                if let Err(errors) = schema.check_params(info, &ctx.params.0) {
                    return Ok(respond(Err(ApiError::params(errors))));
                }
                Some(info)
            }
            None => {
                let m = ctx.method.as_str();
                return Ok(respond(Err(ApiError::new(
                    501,
                    format!("Method '{m} {rel}' not implemented"),
                ))));
            }
        },
        _ => None,
    };
    let app2 = app.clone();
    let result = tokio::task::spawn_blocking(move || dispatch(&app2, ctx))
        .await
        .unwrap_or_else(|e| Err(ApiError::die(format!("internal error: {e}"))));
    let result = match (result, schema_info, &*app.schema) {
        (Ok(reply), Some(info), Ok(schema)) => match schema.check_returns(info, &reply.data) {
            Ok(()) => Ok(reply),
            Err(e) => Err(ApiError::die(format!(
                "lab: response does not match the API schema: {e}"
            ))),
        },
        (r, _, _) => r,
    };
    Ok(respond(result))
}

/// Adds `{node}`, `{vmid}`, ... from the path to the parameters, as Proxmox does.
fn add_path_params(tmpl: &str, segs: &[&str], params: &mut Params) {
    for (t, s) in tmpl.split('/').filter(|s| !s.is_empty()).zip(segs) {
        if let Some(name) = t.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
            params
                .0
                .insert(name.to_string(), Value::String((*s).to_string()));
        }
    }
}

fn not_implemented(ctx: &Ctx) -> ApiError {
    ApiError::new(
        501,
        format!(
            "Method '{} /{}' not implemented",
            ctx.method,
            ctx.segs.join("/")
        ),
    )
}

/// A directory index (`[{"subdir": ...}]`).
pub(super) fn subdirs(names: &[&str]) -> Reply {
    Reply::data(Value::Array(
        names.iter().map(|n| json!({ "subdir": n })).collect(),
    ))
}

/// Routes to the handler of the request's API area.
fn dispatch(app: &App, mut ctx: Ctx) -> ApiResult<Reply> {
    let segs: Vec<String> = ctx.segs.clone();
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    let m = ctx.method.clone();
    // In cluster mode any member's API reaches every node, as on Proxmox.
    let view;
    let app = if let ["nodes", node, ..] = s.as_slice() {
        let Some(on) = app.on(node) else {
            return Err(ApiError::die(format!(
                "hostname lookup '{node}' failed - failed to get address info for: {node}: Name or service not known"
            )));
        };
        ctx.params.0.insert("node".into(), json!(node));
        view = on;
        &view
    } else {
        app
    };
    match (m, s.as_slice()) {
        (Method::GET, ["version"]) => super::cluster::version(),
        (Method::GET, ["cluster", "nextid"]) => super::cluster::nextid(app, &ctx),
        (Method::GET, ["nodes"]) => super::cluster::nodes(app),
        (Method::GET, ["cluster", "resources"]) => super::cluster::resources(app, &ctx),
        (Method::GET, ["access", "permissions"]) => permissions(&ctx),
        (Method::GET, ["nodes", _]) => {
            Ok(subdirs(&["lxc", "storage", "tasks", "status", "version"]))
        }
        (Method::GET, ["nodes", _, "tasks"]) => app.tasks.list(&ctx.params),
        (Method::GET, ["nodes", _, "tasks", upid, "status"]) => app.tasks.status(upid),
        (Method::GET, ["nodes", _, "tasks", upid, "log"]) => app.tasks.log(upid, &ctx.params),
        (_, ["nodes", _, "lxc", ..]) => {
            super::lxc::route(app, &ctx, &s[2..]).unwrap_or_else(|| Err(not_implemented(&ctx)))
        }
        (_, ["nodes", _, "storage", ..]) => {
            super::storage::route(app, &ctx, &s[2..]).unwrap_or_else(|| Err(not_implemented(&ctx)))
        }
        (m, ["lab", "faults"]) => faults(app, &ctx, m),
        (Method::GET, ["lab", "status"]) => Ok(Reply::data(json!({
            "schema": match &*app.schema { Ok(_) => "on".to_string(), Err(why) => format!("skipped: {why}") },
            "node": app.node.lab.node,
        }))),
        _ => Err(not_implemented(&ctx)),
    }
}

/// `GET /access/permissions`: the caller's own effective privileges, at `path` or at
/// each path it holds something on (another user's need `Sys.Audit` on `/access`).
fn permissions(ctx: &Ctx) -> ApiResult<Reply> {
    if let Some(other) = ctx.params.str("userid")
        && other != ctx.user.authid()
    {
        ctx.user.check("/access", &["Sys.Audit"])?;
        return Err(ApiError::new(
            501,
            "lab: permissions of another user are not modelled",
        ));
    }
    let privs = |path: &str| -> Value {
        Value::Object(
            ctx.user
                .privileges(path)
                .into_iter()
                .map(|p| (p.to_string(), json!(1)))
                .collect(),
        )
    };
    let paths: Vec<String> = match ctx.params.str("path") {
        Some(p) => vec![p],
        None if ctx.user.token.as_deref() == Some(crate::pve::perms::PRIVSEP_TOKEN) => {
            crate::pve::perms::PRIVSEP_GRANTS
                .iter()
                .map(|(p, _)| p.to_string())
                .collect()
        }
        None => vec!["/".to_string()],
    };
    Ok(Reply::data(Value::Object(
        paths.iter().map(|p| (p.clone(), privs(p))).collect(),
    )))
}

/// The private fault switch: `GET` lists, `POST` adds a rule (JSON body), `DELETE` clears.
fn faults(app: &App, ctx: &Ctx, m: Method) -> ApiResult<Reply> {
    if !ctx.user.userid.eq("root@pam") {
        return Err(ApiError::perm(Some("/lab/faults, Sys.Modify")));
    }
    match m {
        Method::GET => Ok(Reply::data(
            serde_json::to_value(app.faults.list()).expect("rules serialise"),
        )),
        Method::DELETE => {
            app.faults.clear();
            Ok(Reply::data(Value::Null))
        }
        Method::POST => {
            let rule: FaultRule = serde_json::from_value(Value::Object(ctx.params.0.clone()))
                .map_err(|e| ApiError::new(400, format!("bad fault rule: {e}")))?;
            app.faults.add(rule)?;
            Ok(Reply::data(Value::Null))
        }
        _ => Err(not_implemented(ctx)),
    }
}
