//! Roles as data: a role names the resources it contributes, with fields written as
//! handlebars templates over the container's context, so users add roles without
//! recompiling. See `roles/*.yaml` for the shipped ones and `docs/roles.md` for the format.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};

use super::service::BuiltService;
use super::{Renderer, list_dir, scalar_text};
use crate::diagnostic::Diagnostic;
use crate::inventory::load::{diagnostic_at, parse_yaml};
use crate::inventory::spanned::Sp;
use crate::resources::{ResourceSpec, parse_mode};

/// Roles shipped with provision (the repository's `roles/`).
pub const BUILTIN_ROLES: &[(&str, &str)] = &[
    (
        "gpu-passthrough",
        include_str!("../../../roles/gpu-passthrough.yaml"),
    ),
    ("cuda", include_str!("../../../roles/cuda.yaml")),
    ("ml-env", include_str!("../../../roles/ml-env.yaml")),
    (
        "model-store",
        include_str!("../../../roles/model-store.yaml"),
    ),
    ("sglang", include_str!("../../../roles/sglang.yaml")),
];

/// A role file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleFile {
    /// What the role does, in one line.
    description: String,
    /// Context keys that must be present (non-null, non-empty) for the role to apply.
    #[serde(default)]
    requires: Vec<String>,
    /// Repeat the resources for each service or each model.
    for_each: Option<ForEach>,
    /// Resource entries: `kind:` plus the kind's fields; `when:` (a context path that must
    /// be truthy) and `template:` (rendered into a file's `content` or pve_lines' `lines`).
    resources: Vec<Sp<Value>>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ForEach {
    Service,
    Model,
}

/// A loaded role.
#[derive(Debug, Clone)]
pub struct Role {
    /// Its name (the file name without `.yaml`).
    pub name: String,
    /// Where it came from, for messages.
    pub path: PathBuf,
    source: String,
    file: RoleFile,
}

impl Role {
    /// The role's one-line description.
    pub fn description(&self) -> &str {
        &self.file.description
    }
}

/// All roles available to an inventory.
#[derive(Debug, Clone)]
pub struct RoleSet {
    roles: Vec<Role>,
}

impl RoleSet {
    /// Loads the built-in roles, then `*.yaml` in `user_dir` (replacing built-ins of the
    /// same name).
    pub fn load(user_dir: Option<&Path>) -> Result<Self, Diagnostic> {
        let mut roles = Vec::new();
        for (name, text) in BUILTIN_ROLES {
            let path = PathBuf::from(format!("<built in>/roles/{name}.yaml"));
            roles.push(parse_role(name, &path, text)?);
        }
        if let Some(dir) = user_dir {
            for path in list_dir(dir, "yaml")? {
                let name = path
                    .file_stem()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    Diagnostic::new(format!("cannot read role {}", path.display()))
                        .cause(e.to_string())
                })?;
                let role = parse_role(&name, &path, &text)?;
                roles.retain(|r| r.name != name);
                roles.push(role);
            }
        }
        Ok(RoleSet { roles })
    }

    /// Names of all roles.
    pub fn names(&self) -> Vec<String> {
        self.roles.iter().map(|r| r.name.clone()).collect()
    }

    /// A role by name.
    pub fn get(&self, name: &str) -> Option<&Role> {
        self.roles.iter().find(|r| r.name == name)
    }
}

fn parse_role(name: &str, path: &Path, text: &str) -> Result<Role, Diagnostic> {
    let file: RoleFile = parse_yaml(path, text)?;
    Ok(Role {
        name: name.to_string(),
        path: path.to_path_buf(),
        source: text.to_string(),
        file,
    })
}

/// Looks up a dotted path (`ml_env.sglang.path`) in `ctx`.
fn lookup<'a>(ctx: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(ctx, |v, key| v.get(key))
}

/// Handlebars' idea of truth: not null, false, 0, "" or an empty list.
fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(_) => true,
    }
}

impl Role {
    fn error_at(&self, pos: crate::inventory::Pos, message: String) -> Diagnostic {
        diagnostic_at(&self.path, &self.source, pos, message)
    }

    /// Whether the role's `requires` hold in `ctx`; the first missing key otherwise.
    pub fn missing_requirement(&self, ctx: &Value) -> Option<String> {
        self.file
            .requires
            .iter()
            .find(|k| !truthy(lookup(ctx, k)))
            .cloned()
    }

    /// The role's resources for a container whose context is `ctx` and whose inventory
    /// services are `services`.
    pub fn expand(
        &self,
        ctx: &Value,
        renderer: &Renderer,
        services: &[BuiltService],
    ) -> Result<Vec<ResourceSpec>, Diagnostic> {
        let scopes: Vec<Value> = match self.file.for_each {
            None => vec![ctx.clone()],
            Some(each) => {
                let (list, key) = match each {
                    ForEach::Service => ("services", "service"),
                    ForEach::Model => ("models", "model"),
                };
                lookup(ctx, list)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|item| {
                        let mut scope = ctx.clone();
                        scope[key] = item.clone();
                        scope
                    })
                    .collect()
            }
        };
        let mut out = Vec::new();
        for scope in &scopes {
            for entry in &self.file.resources {
                if let Some(spec) = self.expand_entry(entry, scope, renderer, services)? {
                    out.push(spec);
                }
            }
        }
        Ok(out)
    }

    fn expand_entry(
        &self,
        entry: &Sp<Value>,
        scope: &Value,
        renderer: &Renderer,
        services: &[BuiltService],
    ) -> Result<Option<ResourceSpec>, Diagnostic> {
        let Some(obj) = entry.value.as_object() else {
            return Err(self.error_at(
                entry.pos,
                "a resource entry must be a mapping with `kind:`".into(),
            ));
        };
        let mut obj = obj.clone();
        if let Some(when) = obj.remove("when") {
            let path = when.as_str().unwrap_or_default();
            if !truthy(lookup(scope, path)) {
                return Ok(None);
            }
        }
        let template = obj.remove("template");
        let mut rendered = Map::new();
        for (k, v) in obj {
            let v = render_value(&v, scope, renderer)
                .map_err(|e| self.error_at(entry.pos, format!("field `{k}`: {e}")))?;
            rendered.insert(k, v);
        }
        let kind = rendered
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if let Some(t) = template {
            let name = t.as_str().unwrap_or_default();
            let text = renderer.render(name, scope)?;
            match kind.as_str() {
                "file" => {
                    rendered.insert("content".into(), Value::String(text));
                }
                "pve_lines" => {
                    let lines: Vec<Value> = text
                        .lines()
                        .map(str::trim)
                        .filter(|l| !l.is_empty() && !l.starts_with('#'))
                        .map(|l| Value::String(l.to_string()))
                        .collect();
                    rendered.insert("lines".into(), Value::Array(lines));
                }
                other => {
                    return Err(self.error_at(
                        entry.pos,
                        format!("`template:` does not apply to kind `{other}`"),
                    ));
                }
            }
        }
        if kind == "removed" {
            // What is no longer declared comes from the guest's record, never from a role.
            return Err(self
                .error_at(
                    entry.pos,
                    "kind `removed` is what provision plans for what it made and no longer declares; a role cannot write it".into(),
                )
                .hint("leave the resource out of the role: provision removes what it made (see docs/plan-format.md)"));
        }
        if kind == "service" && rendered.contains_key("declared") {
            // Positions in the inventory are provision's to record (a saved plan keeps them).
            return Err(self
                .error_at(
                    entry.pos,
                    "field `declared`: where a service is declared is recorded by provision; a role cannot set it".into(),
                )
                .hint("see docs/roles.md for each kind's fields"));
        }
        if kind == "service"
            && let Some(of) = rendered.remove("of")
        {
            return self
                .inventory_service(entry, of, rendered, scope, renderer, services)
                .map(Some);
        }
        if matches!(kind.as_str(), "file" | "directory") {
            for key in ["owner", "group"] {
                rendered
                    .entry(key)
                    .or_insert_with(|| Value::String("root".into()));
            }
            let default_mode = if kind == "file" { "0644" } else { "0755" };
            let mode_text = match rendered.get("mode") {
                Some(Value::String(s)) => s.clone(),
                None => default_mode.to_string(),
                Some(other) => other.to_string(),
            };
            let mode = parse_mode(&mode_text).ok_or_else(|| {
                self.error_at(
                    entry.pos,
                    format!("`{mode_text}` is not an octal mode such as \"0644\""),
                )
            })?;
            rendered.insert("mode".into(), Value::from(mode));
        }
        serde_json::from_value::<ResourceSpec>(Value::Object(rendered))
            .map(Some)
            .map_err(|e| {
                self.error_at(entry.pos, format!("resource of kind `{kind}`: {e}"))
                    .hint("see docs/roles.md for each kind's fields")
            })
    }
}

impl Role {
    /// A `service` entry with `of: NAME`: the inventory's service of that name as built in
    /// Rust ([`BuiltService`]), its fallbacks' unit files rendered from `unit_template`.
    fn inventory_service(
        &self,
        entry: &Sp<Value>,
        of: Value,
        mut fields: Map<String, Value>,
        scope: &Value,
        renderer: &Renderer,
        services: &[BuiltService],
    ) -> Result<ResourceSpec, Diagnostic> {
        let name = scalar_text(&of);
        let built = services.iter().find(|s| s.name == name).ok_or_else(|| {
            self.error_at(
                entry.pos,
                format!("`of: {name}` names no service of this container"),
            )
            .hint("`of:` takes a name under the container's `services:`, e.g. \"{{service.name}}\" with `for_each: service`")
        })?;
        fields.remove("kind");
        let template = fields.remove("unit_template");
        if let Some(field) = fields.keys().next() {
            return Err(self
                .error_at(
                    entry.pos,
                    format!("field `{field}`: a service built from the inventory (`of:`) takes only `unit_template`"),
                )
                .hint("the inventory's service settings say the rest; see docs/roles.md"));
        }
        let spec = match template {
            Some(t) => {
                let template = scalar_text(&t);
                built.with_fallbacks(|view| {
                    let mut fb_scope = scope.clone();
                    fb_scope["service"] = serde_json::to_value(view).map_err(|e| {
                        Diagnostic::new("a fallback's view does not serialize").cause(e.to_string())
                    })?;
                    renderer.render(&template, &fb_scope)
                })?
            }
            None if !built.fallbacks.is_empty() => {
                return Err(self
                    .error_at(
                        entry.pos,
                        format!("service `{name}` declares fallbacks, but this entry names no `unit_template` to render their units"),
                    )
                    .hint("add `unit_template:` with the template of the service's unit file"));
            }
            None => built.spec.clone(),
        };
        Ok(ResourceSpec::Service(Box::new(spec)))
    }
}

/// Why a role's field could not be rendered.
#[derive(Debug, thiserror::Error)]
enum FieldError {
    /// A `{{path}}` that names nothing.
    #[error("`{0}` is not in the context")]
    NotInContext(String),
    /// The template engine refused the text.
    #[error(transparent)]
    Template(#[from] handlebars::RenderError),
}

/// Renders every string in `v`. A string that is exactly one `{{path}}` takes the value at
/// that path as it is (a list, a number, null), so roles can pass lists through.
fn render_value(v: &Value, scope: &Value, renderer: &Renderer) -> Result<Value, FieldError> {
    match v {
        Value::String(s) => {
            let t = s.trim();
            if let Some(inner) = t.strip_prefix("{{").and_then(|r| r.strip_suffix("}}")) {
                let path = inner.trim();
                if !path.is_empty()
                    && !t[2..].contains("{{")
                    && path
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
                {
                    return lookup(scope, path)
                        .cloned()
                        .ok_or_else(|| FieldError::NotInContext(path.to_string()));
                }
            }
            Ok(Value::String(renderer.render_str(s, scope)?))
        }
        Value::Array(a) => a
            .iter()
            .map(|x| render_value(x, scope, renderer))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        Value::Object(o) => o
            .iter()
            .map(|(k, x)| render_value(x, scope, renderer).map(|r| (k.clone(), r)))
            .collect::<Result<Map<_, _>, _>>()
            .map(Value::Object),
        other => Ok(other.clone()),
    }
}
