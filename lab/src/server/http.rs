//! Requests in (parameters from the query, a form or a JSON body) and responses out, in
//! pveproxy's envelope: `{"data": ...}`, and on error the status line's reason set to the
//! message's first line with `message` and `errors` in the body.

use hyper::body::Bytes;
use hyper::{Response, StatusCode};
use serde_json::{Map, Value, json};

use crate::error::{ApiError, ApiResult};

/// The response body type.
pub type Body = http_body_util::Full<Bytes>;

/// A successful reply: `data`, plus `total` for lists that page.
#[derive(Debug, Default)]
pub struct Reply {
    /// The `data` member.
    pub data: Value,
    /// The `total` member, for task logs.
    pub total: Option<u64>,
}

impl Reply {
    /// A reply with data only.
    pub fn data(data: Value) -> Reply {
        Reply { data, total: None }
    }
}

/// Request parameters by name.
#[derive(Debug, Default, Clone)]
pub struct Params(pub Map<String, Value>);

fn type_error(key: &str, ty: &str, v: &str) -> ApiError {
    ApiError::param(key, format!("type check ('{ty}') failed - got '{v}'"))
}

impl Params {
    /// Parses the query string and body as pveproxy does.
    pub fn parse(
        query: Option<&str>,
        content_type: Option<&str>,
        body: &[u8],
    ) -> ApiResult<Params> {
        let mut map = Map::new();
        let mut add_pairs = |raw: &[u8]| {
            for (k, v) in form_urlencoded::parse(raw) {
                map.insert(k.into_owned(), Value::String(v.into_owned()));
            }
        };
        if let Some(q) = query {
            add_pairs(q.as_bytes());
        }
        if !body.is_empty() {
            if content_type.is_some_and(|c| c.starts_with("application/json")) {
                let v: Value = serde_json::from_slice(body)
                    .map_err(|e| ApiError::new(400, format!("unable to parse JSON body - {e}")))?;
                let Value::Object(obj) = v else {
                    return Err(ApiError::new(400, "JSON body must be an object"));
                };
                map.extend(obj);
            } else {
                add_pairs(body);
            }
        }
        Ok(Params(map))
    }

    /// A parameter as text (numbers and booleans as Proxmox would print them).
    pub fn str(&self, k: &str) -> Option<String> {
        self.0.get(k).map(crate::pve::options::to_conf_value)
    }

    /// An integer parameter, with Proxmox's type-check message when it is not one.
    pub fn int(&self, k: &str) -> ApiResult<Option<i64>> {
        match self.0.get(k) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_i64()
                .map(Some)
                .ok_or_else(|| type_error(k, "integer", &n.to_string())),
            Some(v) => {
                let s = crate::pve::options::to_conf_value(v);
                s.trim()
                    .parse()
                    .map(Some)
                    .map_err(|_| type_error(k, "integer", &s))
            }
        }
    }

    /// A boolean parameter (`0`/`1`, or JSON booleans).
    pub fn bool(&self, k: &str) -> ApiResult<Option<bool>> {
        match self.0.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => match crate::pve::options::to_conf_value(v).as_str() {
                "1" => Ok(Some(true)),
                "0" => Ok(Some(false)),
                s => Err(type_error(k, "boolean", s)),
            },
        }
    }

    /// The vmid, required and in range.
    pub fn vmid(&self) -> ApiResult<u32> {
        let v = self
            .int("vmid")?
            .ok_or_else(|| ApiError::param("vmid", "property is missing and it is not optional"))?;
        // `pve-vmid` is checked before the range, so Proxmox answers with the format error.
        if !(100..=999_999_999).contains(&v) {
            return Err(ApiError::param(
                "vmid",
                "invalid format - value does not look like a valid VM ID",
            ));
        }
        Ok(v as u32)
    }
}

/// Builds the HTTP response for a reply or an error.
pub fn respond(result: ApiResult<Reply>) -> Response<Body> {
    match result {
        Ok(reply) => {
            let mut body = json!({ "data": reply.data });
            if let Some(t) = reply.total {
                body["total"] = json!(t);
            }
            json_response(StatusCode::OK, None, &body)
        }
        Err(e) => {
            let mut body = json!({ "data": null, "message": format!("{}\n", e.message) });
            if !e.errors.is_empty() {
                body["errors"] = json!(e.errors);
            }
            let status =
                StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            json_response(status, Some(&e.message), &body)
        }
    }
}

fn json_response(status: StatusCode, reason: Option<&str>, body: &Value) -> Response<Body> {
    let raw = serde_json::to_vec(body).expect("JSON values serialise");
    let mut resp = Response::builder()
        .status(status)
        .header("content-type", "application/json;charset=UTF-8")
        .header("cache-control", "max-age=0")
        .body(Body::new(Bytes::from(raw)))
        .expect("static headers are valid");
    if let Some(reason) = reason {
        let first = reason.lines().next().unwrap_or("").to_string();
        if let Ok(r) = hyper::ext::ReasonPhrase::try_from(first.into_bytes()) {
            resp.extensions_mut().insert(r);
        }
    }
    resp
}
