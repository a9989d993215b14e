//! Templates (handlebars: strict, no HTML escaping) and roles, both loaded as data: the
//! user's folders first, then the ones built into provision.

pub mod context;
pub mod passthrough;
pub mod roles;
pub mod service;
pub mod sglang;
pub use crate::resources::service::systemd;

use std::path::{Path, PathBuf};

use handlebars::{Handlebars, handlebars_helper};
use serde_json::Value;

use crate::diagnostic::Diagnostic;
use crate::transport::shell_quote;

/// Templates shipped with provision (the repository's `templates/`).
pub const BUILTIN_TEMPLATES: &[(&str, &str)] = &[
    (
        "sglang.service.hbs",
        include_str!("../../../templates/sglang.service.hbs"),
    ),
    (
        "cuda-profile.sh.hbs",
        include_str!("../../../templates/cuda-profile.sh.hbs"),
    ),
    (
        "lxc-gpu-passthrough.conf.hbs",
        include_str!("../../../templates/lxc-gpu-passthrough.conf.hbs"),
    ),
];

/// Where a template came from, for messages.
#[derive(Debug, Clone)]
pub enum Origin {
    /// Built into provision.
    Builtin,
    /// A file in the user's folder.
    File(PathBuf),
}

/// Renders named templates.
pub struct Renderer {
    hb: Handlebars<'static>,
    origins: Vec<(String, Origin)>,
}

impl std::fmt::Debug for Renderer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renderer")
            .field("templates", &self.origins)
            .finish()
    }
}

handlebars_helper!(eq_helper: |a: Value, b: Value| a == b);
handlebars_helper!(systemd_exec_helper: |words: Vec<Value>| words
    .iter()
    .map(|w| systemd::quote_exec_word(&scalar_text(w)))
    .collect::<Vec<_>>()
    .join(" "));
handlebars_helper!(systemd_env_helper: |name: Value, value: Value|
    systemd::quote_environment(&scalar_text(&name), &scalar_text(&value)));
handlebars_helper!(shell_quote_helper: |word: Value| shell_quote(&scalar_text(&word)));
handlebars_helper!(strip_root_helper: |path: Value| scalar_text(&path).trim_start_matches('/').to_string());

/// A JSON scalar as text (strings without quotes).
pub fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

impl Renderer {
    /// Loads the built-in templates, then every `*.hbs` in `user_dir` (replacing built-ins
    /// of the same name).
    pub fn new(user_dir: Option<&Path>) -> Result<Self, Diagnostic> {
        let mut hb = Handlebars::new();
        hb.set_strict_mode(true);
        hb.register_escape_fn(handlebars::no_escape);
        hb.register_helper("eq", Box::new(eq_helper));
        hb.register_helper("systemd_exec", Box::new(systemd_exec_helper));
        hb.register_helper("systemd_env", Box::new(systemd_env_helper));
        hb.register_helper("shell_quote", Box::new(shell_quote_helper));
        hb.register_helper("strip_root", Box::new(strip_root_helper));
        let mut origins = Vec::new();
        for (name, text) in BUILTIN_TEMPLATES {
            hb.register_template_string(name, *text).map_err(|e| {
                Diagnostic::new(format!("built-in template {name} does not parse: {e}"))
            })?;
            origins.push((name.to_string(), Origin::Builtin));
        }
        if let Some(dir) = user_dir {
            for path in list_dir(dir, "hbs")? {
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    Diagnostic::new(format!("cannot read template {}", path.display()))
                        .cause(e.to_string())
                })?;
                hb.register_template_string(&name, text).map_err(|e| {
                    let mut d =
                        Diagnostic::new(format!("template {} does not parse", path.display()))
                            .cause(e.to_string());
                    if let Some((line, col)) = e.pos() {
                        d = d.cause(format!("at {}:{line}:{col}", path.display()));
                    }
                    d
                })?;
                origins.retain(|(n, _)| *n != name);
                origins.push((name, Origin::File(path)));
            }
        }
        Ok(Renderer { hb, origins })
    }

    /// Whether a template of this name exists.
    pub fn has(&self, name: &str) -> bool {
        self.hb.has_template(name)
    }

    /// Renders template `name` with `ctx`.
    pub fn render(&self, name: &str, ctx: &Value) -> Result<String, Diagnostic> {
        if !self.has(name) {
            let names: Vec<&str> = self.origins.iter().map(|(n, _)| n.as_str()).collect();
            return Err(Diagnostic::new(format!("no template named `{name}`"))
                .hint(format!("templates: {}", names.join(", "))));
        }
        self.hb.render(name, ctx).map_err(|e| {
            let origin = self
                .origins
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, o)| match o {
                    Origin::Builtin => format!("built-in template {name}"),
                    Origin::File(p) => p.display().to_string(),
                })
                .unwrap_or_else(|| name.to_string());
            let mut d = Diagnostic::new(format!("cannot render {origin}")).cause(e.to_string());
            if let (Some(line), Some(col)) = (e.line_no, e.column_no) {
                d = d.cause(format!("at line {line}, column {col} of the template"));
            }
            d.hint("strict mode: every value a template uses must exist in the context")
        })
    }

    /// Renders an inline template string (role fields).
    pub fn render_str(
        &self,
        template: &str,
        ctx: &Value,
    ) -> Result<String, handlebars::RenderError> {
        self.hb.render_template(template, ctx)
    }
}

/// Files with extension `ext` in `dir`, sorted by name.
pub fn list_dir(dir: &Path, ext: &str) -> Result<Vec<PathBuf>, Diagnostic> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        Diagnostic::new(format!("cannot read folder {}", dir.display()))
            .cause(e.to_string())
            .hint("check `paths:` in the inventory; it is relative to the inventory file")
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    files.sort();
    Ok(files)
}
