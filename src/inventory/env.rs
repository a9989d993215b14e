//! `{ env: VAR }` for any value of an inventory: the node's SSH host and port, a container's
//! vmid, bridge and address, a model's endpoint... so one inventory serves a lab (whose
//! `eval "$(scripts/lab up)"` exports them) and a real node.
//!
//! References are replaced by the variables' values before the typed parse, in place on
//! the same line, so every value keeps its line and its start column and is checked by its
//! own type as if written there; an unset variable is an error at the reference. Secrets
//! (`token`, `password`) are left as references, resolved only when used and never held in
//! the inventory; `api.url` and `tls.fingerprint` resolve when the node is contacted, so an
//! offline plan does not need them.

use std::fmt;
use std::path::Path;

use serde::Deserialize;
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

use super::load::diagnostic_at;
use super::spanned::Pos;
use crate::diagnostic::Diagnostic;

/// A YAML document as a tree, with where each value starts.
enum Node {
    Scalar,
    Seq(Vec<Spanned<Node>>),
    Map(Vec<(String, Spanned<Node>)>),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_str<E>(self, _: &str) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_unit<E>(self) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_none<E>(self) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Node::Seq(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<KeyText>()? {
                    entries.push((key.0, map.next_value()?));
                }
                Ok(Node::Map(entries))
            }
        }
        d.deserialize_any(V)
    }
}

/// A mapping key as text (keys that are not strings are kept as `""`; no reference has one).
struct KeyText(String);

impl<'de> Deserialize<'de> for KeyText {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeyText;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E>(self, s: &str) -> Result<KeyText, E> {
                Ok(KeyText(s.to_string()))
            }
            fn visit_bool<E>(self, _: bool) -> Result<KeyText, E> {
                Ok(KeyText(String::new()))
            }
            fn visit_i64<E>(self, _: i64) -> Result<KeyText, E> {
                Ok(KeyText(String::new()))
            }
            fn visit_u64<E>(self, _: u64) -> Result<KeyText, E> {
                Ok(KeyText(String::new()))
            }
            fn visit_f64<E>(self, _: f64) -> Result<KeyText, E> {
                Ok(KeyText(String::new()))
            }
            fn visit_unit<E>(self) -> Result<KeyText, E> {
                Ok(KeyText(String::new()))
            }
        }
        d.deserialize_any(V)
    }
}

/// One `{ env: VAR }` found in the text.
struct Reference {
    /// Byte range of the whole reference in the source.
    start: usize,
    end: usize,
    /// Where it is written.
    pos: Pos,
    var: String,
}

/// Whether a reference under `key` (inside `parent`) is left for its field to resolve.
fn resolved_later(parent: Option<&str>, key: &str) -> bool {
    matches!(key, "token" | "password")
        || (key == "fingerprint" && parent == Some("tls"))
        || (key == "url" && parent == Some("api"))
}

/// `source` with every `{ env: VAR }` replaced by the variable's value; each unset or
/// unusable variable is one diagnostic. A document that does not parse is returned as it
/// is, for the typed parse to report.
pub fn substitute(path: &Path, source: &str) -> Result<String, Vec<Diagnostic>> {
    if !source.contains("env") {
        return Ok(source.to_string());
    }
    let Ok(tree) = super::load::parse_yaml::<Spanned<Node>>(path, source) else {
        return Ok(source.to_string());
    };
    let mut refs = Vec::new();
    let mut errors = Vec::new();
    collect(path, source, &tree, None, None, &mut refs, &mut errors);
    if refs.is_empty() && errors.is_empty() {
        return Ok(source.to_string());
    }
    refs.sort_by_key(|r| r.start);
    let mut out = String::with_capacity(source.len());
    let mut at = 0;
    for r in refs {
        if r.start < at {
            continue;
        }
        let value = match std::env::var(&r.var) {
            Ok(v) if !v.trim().is_empty() => v.trim().to_string(),
            _ => {
                errors.push(
                    diagnostic_at(
                        path,
                        source,
                        r.pos,
                        format!("environment variable `{}` is not set", r.var),
                    )
                    .hint(format!(
                        "export {} (for the lab: `eval \"$(scripts/lab up)\"`), or write the value here",
                        r.var
                    )),
                );
                continue;
            }
        };
        if let Some(what) = super::text::control_char(&value) {
            errors.push(
                diagnostic_at(
                    path,
                    source,
                    r.pos,
                    format!("environment variable `{}` contains {what}", r.var),
                )
                .hint("a value read from the environment is one line of text"),
            );
            continue;
        }
        out.push_str(&source[at..r.start]);
        out.push_str(&yaml_scalar(&value));
        at = r.end;
    }
    out.push_str(&source[at..]);
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// Finds the references in `node` (the value of `key` in a mapping under `parent`).
fn collect(
    path: &Path,
    source: &str,
    node: &Spanned<Node>,
    parent: Option<&str>,
    key: Option<&str>,
    refs: &mut Vec<Reference>,
    errors: &mut Vec<Diagnostic>,
) {
    match &node.value {
        Node::Scalar => {}
        Node::Seq(items) => {
            for item in items {
                collect(path, source, item, parent, key, refs, errors);
            }
        }
        Node::Map(entries) => {
            if let [(k, value)] = entries.as_slice()
                && k == "env"
                && matches!(value.value, Node::Scalar)
            {
                if key.is_some_and(|k| resolved_later(parent, k)) {
                    return;
                }
                match locate(source, node, value) {
                    Some(r) => refs.push(r),
                    None => errors.push(
                        diagnostic_at(
                            path,
                            source,
                            pos_of(node),
                            "cannot read this `env:` reference",
                        )
                        .hint("write it on one line: `{ env: VAR }`"),
                    ),
                }
                return;
            }
            for (k, value) in entries {
                collect(path, source, value, key, Some(k), refs, errors);
            }
        }
    }
}

fn pos_of<T>(node: &Spanned<T>) -> Pos {
    let loc = node.referenced;
    Pos {
        line: u32::try_from(loc.line()).unwrap_or(u32::MAX),
        column: u32::try_from(loc.column()).unwrap_or(u32::MAX),
    }
}

/// The byte range of a reference: `{ env: VAR }` from its brace to the closing one, or the
/// block form `env: VAR` to the end of the name; `None` when it spans lines or has an
/// alias (it is then not where its text says).
fn locate(source: &str, map: &Spanned<Node>, name: &Spanned<Node>) -> Option<Reference> {
    let start = usize::try_from(map.referenced.span().byte_offset()?).ok()?;
    let name_start = usize::try_from(name.referenced.span().byte_offset()?).ok()?;
    let name_len = usize::try_from(name.referenced.span().byte_len()?).ok()?;
    let name_end = name_start.checked_add(name_len)?;
    if map.referenced != map.defined || start >= name_end || name_end > source.len() {
        return None;
    }
    let var = source
        .get(name_start..name_end)?
        .trim_matches(|c| c == '"' || c == '\'')
        .to_string();
    let end = if source[start..].starts_with('{') {
        name_end + source[name_end..].find('}')? + 1
    } else {
        name_end
    };
    if source[start..end].contains('\n') || !source[start..end].contains("env") {
        return None;
    }
    Some(Reference {
        start,
        end,
        pos: pos_of(map),
        var,
    })
}

/// `value` as a YAML scalar that reads back as written: plain when it is a simple word
/// (so `2722` is a number for a port), else double-quoted.
fn yaml_scalar(value: &str) -> String {
    let simple = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._/-:@+".contains(c))
        && value
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '/' || c == '.')
        && !value.contains(": ")
        && !matches!(
            value.to_ascii_lowercase().as_str(),
            "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "~"
        );
    if simple {
        value.to_string()
    } else {
        serde_json::to_string(value).expect("a string serializes")
    }
}

/// Lets every scalar field of `schema` (an inventory's JSON Schema) be written as
/// `{ env: VAR }` too, as [`substitute`] accepts it.
pub fn allow_env_references(schema: &mut serde_json::Value) {
    use serde_json::{Value, json};
    let defs = schema.get("$defs").cloned().unwrap_or_else(|| json!({}));
    let is_scalar = |s: &Value| -> bool {
        let target = match s.get("$ref").and_then(Value::as_str) {
            Some(r) => r.strip_prefix("#/$defs/").and_then(|name| defs.get(name)),
            None => Some(s),
        };
        let Some(t) = target else { return false };
        if t.get("properties").is_some() || t.get("oneOf").is_some() || t.get("anyOf").is_some() {
            return false;
        }
        let scalar = |v: &Value| {
            matches!(
                v.as_str(),
                Some("string" | "integer" | "number" | "boolean")
            )
        };
        match t.get("type") {
            Some(Value::String(_)) => scalar(&t["type"]),
            Some(Value::Array(types)) => {
                types.iter().any(scalar)
                    && !types
                        .iter()
                        .any(|v| matches!(v.as_str(), Some("object" | "array")))
            }
            _ => t.get("enum").is_some(),
        }
    };
    fn walk(v: &mut Value, is_scalar: &dyn Fn(&Value) -> bool) {
        match v {
            Value::Object(map) => {
                for key in ["properties", "additionalProperties", "items"] {
                    let Some(child) = map.get_mut(key) else {
                        continue;
                    };
                    let slots: Vec<&mut Value> = match (key, child) {
                        ("properties", Value::Object(props)) => props.values_mut().collect(),
                        (_, c @ Value::Object(_)) => vec![c],
                        _ => Vec::new(),
                    };
                    for slot in slots {
                        if is_scalar(slot) {
                            wrap(slot);
                        }
                    }
                }
                for child in map.values_mut() {
                    walk(child, is_scalar);
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|c| walk(c, is_scalar)),
            _ => {}
        }
    }
    fn wrap(slot: &mut Value) {
        let Value::Object(inner) = std::mem::take(slot) else {
            return;
        };
        let mut outer = serde_json::Map::new();
        let mut inner = inner;
        for k in ["description", "default"] {
            if let Some(v) = inner.remove(k) {
                outer.insert(k.to_string(), v);
            }
        }
        outer.insert(
            "anyOf".into(),
            json!([Value::Object(inner), {"$ref": "#/$defs/EnvRef"}]),
        );
        *slot = Value::Object(outer);
    }
    walk(schema, &is_scalar);
    if let Some(Value::Object(defs)) = schema.get_mut("$defs") {
        defs.insert(
            "EnvRef".into(),
            json!({
                "description": "The value of an environment variable, read when the inventory is loaded (an unset one is an error at this line).",
                "type": "object",
                "properties": {"env": {"type": "string"}},
                "required": ["env"],
                "additionalProperties": false
            }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(text: &str) -> Result<String, Vec<Diagnostic>> {
        substitute(Path::new("t.yaml"), text)
    }

    #[test]
    fn flow_and_block_references_are_replaced_in_place() {
        // SAFETY: tests of this module are the only readers of these variables.
        unsafe {
            std::env::set_var("PROVISION_ENV_T_PORT", "2722");
            std::env::set_var("PROVISION_ENV_T_IP", "10.85.0.10/24");
        }
        let text = "a:\n  port: { env: PROVISION_ENV_T_PORT }\n  ip:\n    env: PROVISION_ENV_T_IP\n  token: { env: PROVISION_ENV_T_PORT }\n";
        let out = sub(text).unwrap();
        assert_eq!(
            out,
            "a:\n  port: 2722\n  ip:\n    10.85.0.10/24\n  token: { env: PROVISION_ENV_T_PORT }\n"
        );
        assert_eq!(out.lines().count(), text.lines().count());
    }

    #[test]
    fn an_unset_variable_is_an_error_at_its_reference() {
        let errs = sub("a:\n  b: [1, { env: PROVISION_ENV_T_UNSET }]\n").unwrap_err();
        let text = errs[0].to_string();
        assert!(text.contains("PROVISION_ENV_T_UNSET"), "{text}");
        assert!(text.contains("t.yaml:2:"), "{text}");
    }

    #[test]
    fn odd_values_are_quoted() {
        assert_eq!(yaml_scalar("vmbr0"), "vmbr0");
        assert_eq!(yaml_scalar("true"), "\"true\"");
        assert_eq!(yaml_scalar("a b: c"), "\"a b: c\"");
        assert_eq!(yaml_scalar("#x"), "\"#x\"");
    }
}
