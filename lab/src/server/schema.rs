//! Validation against the official API schema (`apidata-9.1.3.json`): parameters as
//! `PVE::JSONSchema::validate` checks them (names, types, formats, patterns, ranges, required
//! fields; messages as Proxmox words them), and every response against the method's `returns`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{Map, Value, json};

use super::schema_format::check_named_format;

/// The loaded schema, indexed by path template.
pub struct Schema {
    methods: HashMap<String, Map<String, Value>>,
}

fn is_true(v: Option<&Value>) -> bool {
    matches!(v, Some(Value::Bool(true))) || v.and_then(Value::as_i64) == Some(1)
}

/// Looks up the property schema for `key`, including `net[n]` style families.
fn property<'a>(props: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    props.get(key).or_else(|| {
        let base = key.trim_end_matches(|c: char| c.is_ascii_digit());
        (base.len() < key.len())
            .then(|| props.get(&format!("{base}[n]")))
            .flatten()
    })
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl Schema {
    /// Loads the schema file.
    pub fn load(path: &Path) -> Result<Schema> {
        let raw =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let tree: Value =
            serde_json::from_str(&raw).with_context(|| format!("parsing {}", path.display()))?;
        let mut methods = HashMap::new();
        fn walk(nodes: &Value, out: &mut HashMap<String, Map<String, Value>>) {
            for n in nodes.as_array().into_iter().flatten() {
                if let (Some(p), Some(info)) = (n["path"].as_str(), n["info"].as_object()) {
                    out.insert(p.to_string(), info.clone());
                }
                walk(&n["children"], out);
            }
        }
        walk(&tree, &mut methods);
        anyhow::ensure!(!methods.is_empty(), "no API paths in {}", path.display());
        Ok(Schema { methods })
    }

    /// The method definition for a request path, preferring literal segments over `{param}`.
    pub fn method(&self, segments: &[&str], method: &str) -> Option<(String, &Map<String, Value>)> {
        let mut best: Option<(usize, &String)> = None;
        for tmpl in self.methods.keys() {
            let parts: Vec<&str> = tmpl.split('/').filter(|s| !s.is_empty()).collect();
            if parts.len() != segments.len() {
                continue;
            }
            let mut literal = 0;
            let ok = parts.iter().zip(segments).all(|(t, s)| {
                if t.starts_with('{') {
                    true
                } else {
                    literal += 1;
                    t == s
                }
            });
            if ok && best.is_none_or(|(l, _)| literal > l) {
                best = Some((literal, tmpl));
            }
        }
        let tmpl = best?.1;
        let info = self.methods[tmpl].get(method)?.as_object()?;
        Some((tmpl.clone(), info))
    }

    /// Checks request parameters; errors map parameter names to Proxmox's messages.
    pub fn check_params(
        &self,
        info: &Map<String, Value>,
        params: &Map<String, Value>,
    ) -> Result<(), BTreeMap<String, String>> {
        let mut errors = BTreeMap::new();
        let empty = Map::new();
        let pschema = info
            .get("parameters")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let props = pschema
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let additional = pschema
            .get("additionalProperties")
            .is_some_and(|v| is_true(Some(v)) || v.is_object());
        for (key, value) in params {
            match property(props, key) {
                Some(s) => {
                    if let Err(e) = check_value(s, value) {
                        errors.insert(key.clone(), e);
                    }
                }
                None if additional => {}
                None => {
                    errors.insert(
                        key.clone(),
                        "property is not defined in schema and the schema does not allow additional properties".into(),
                    );
                }
            }
        }
        for (key, s) in props {
            if key.ends_with("[n]") {
                continue;
            }
            if !is_true(s.get("optional"))
                && !params.contains_key(key)
                && s.get("default").is_none()
            {
                errors.insert(
                    key.clone(),
                    "property is missing and it is not optional".into(),
                );
            }
            if let Some(req) = s.get("requires").and_then(Value::as_str)
                && params.contains_key(key)
                && !params.contains_key(req)
            {
                errors.insert(
                    req.to_string(),
                    format!("missing property - '{key}' requires this property"),
                );
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// Checks a response's `data` against the method's `returns`.
    pub fn check_returns(&self, info: &Map<String, Value>, data: &Value) -> Result<(), String> {
        match info.get("returns") {
            Some(r) => check_return(r, data, "data"),
            None => Ok(()),
        }
    }
}

/// One parameter value against its schema (`check_type` then `check_prop`).
fn check_value(s: &Value, v: &Value) -> Result<(), String> {
    let ty = s.get("type").and_then(Value::as_str).unwrap_or("string");
    let t = text(v);
    let type_err = || format!("type check ('{ty}') failed - got '{t}'");
    match ty {
        "integer" => {
            let ok = match v {
                Value::Number(n) => n.is_i64() || n.is_u64(),
                Value::String(x) => {
                    x.trim()
                        .trim_start_matches(['+', '-'])
                        .chars()
                        .all(|c| c.is_ascii_digit())
                        && !x.trim().is_empty()
                }
                _ => false,
            };
            if !ok {
                return Err(type_err());
            }
        }
        "number" => {
            let ok = match v {
                Value::Number(_) => true,
                Value::String(x) => x.trim().parse::<f64>().is_ok(),
                _ => false,
            };
            if !ok {
                return Err(type_err());
            }
        }
        "boolean" => {
            let ok = match v {
                Value::Bool(_) => true,
                Value::Number(n) => matches!(n.as_i64(), Some(0 | 1)),
                Value::String(x) => x == "0" || x == "1",
                _ => false,
            };
            if !ok {
                return Err(type_err());
            }
        }
        _ => {}
    }
    match s.get("format") {
        Some(Value::Object(fmt)) => {
            check_property_string(fmt, &t).map_err(|e| format!("invalid format - {e}"))?
        }
        Some(Value::String(name)) => {
            check_named_format(name, &t).map_err(|e| format!("invalid format - {e}"))?
        }
        _ => {}
    }
    if let Some(p) = s.get("pattern").and_then(Value::as_str)
        && let Some(re) = perl_regex(p)
        && !re.is_match(&t)
    {
        return Err("value does not match the regex pattern".into());
    }
    if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
        && t.chars().count() as u64 > max
    {
        return Err(format!("value may only be {max} characters long"));
    }
    if let Some(min) = s.get("minLength").and_then(Value::as_u64)
        && (t.chars().count() as u64) < min
    {
        return Err(format!("value must be at least {min} characters long"));
    }
    if let Ok(n) = t.trim().parse::<f64>() {
        if let Some(max) = s.get("maximum").and_then(Value::as_f64)
            && n > max
        {
            return Err(format!(
                "value must have a maximum value of {}",
                text(&s["maximum"])
            ));
        }
        if let Some(min) = s.get("minimum").and_then(Value::as_f64)
            && n < min
        {
            return Err(format!(
                "value must have a minimum value of {}",
                text(&s["minimum"])
            ));
        }
    }
    if let Some(en) = s.get("enum").and_then(Value::as_array)
        && !en.iter().any(|e| text(e) == t)
    {
        let all: Vec<String> = en.iter().map(text).collect();
        return Err(format!(
            "value '{t}' does not have a value in the enumeration '{}'",
            all.join(", ")
        ));
    }
    Ok(())
}

/// A property string against its inline format (`parse_property_string`).
fn check_property_string(fmt: &Map<String, Value>, s: &str) -> Result<(), String> {
    let default_key = fmt
        .iter()
        .find(|(_, v)| is_true(v.get("default_key")))
        .map(|(k, _)| k.clone());
    let mut seen = Map::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = match part.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => match &default_key {
                Some(d) => (d.clone(), part.to_string()),
                None => {
                    return Err(
                        "value without key, but schema does not define a default key".into(),
                    );
                }
            },
        };
        let key = fmt
            .get(&k)
            .and_then(|p| p.get("alias"))
            .and_then(Value::as_str)
            .map_or(k.clone(), str::to_string);
        // `parse_property_string` reads a boolean in any spelling (`keyctl=true`) as 1/0.
        let boolean = fmt.get(&key).and_then(|p| p.get("type")) == Some(&json!("boolean"));
        let v = match crate::pve::propstr::parse_boolean(&v) {
            Some(b) if boolean => b.to_string(),
            _ => v,
        };
        if seen.insert(key, Value::String(v)).is_some() {
            return Err(format!(
                "duplicate key in comma-separated list property: {k}"
            ));
        }
    }
    let mut errs = Vec::new();
    for (k, v) in &seen {
        match fmt.get(k) {
            Some(p) => {
                if let Err(e) = check_value(p, v) {
                    errs.push(format!("{k}: {e}"));
                }
            }
            None => errs.push(format!("{k}: property is not defined in schema and the schema does not allow additional properties")),
        }
    }
    for (k, p) in fmt {
        if !is_true(p.get("optional")) && p.get("alias").is_none() && !seen.contains_key(k) {
            errs.push(format!("{k}: property is missing and it is not optional"));
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(format!("format error\n{}", errs.join("\n")))
    }
}

/// Perl's `(?^:...)` groups turned into Rust regex syntax, anchored as Proxmox anchors them.
fn perl_regex(p: &str) -> Option<regex::Regex> {
    let p = p.replace("(?^i:", "(?i:").replace("(?^:", "(?:");
    regex::Regex::new(&format!("^(?:{p})$")).ok()
}

fn check_return(s: &Value, v: &Value, path: &str) -> Result<(), String> {
    let ty = s.get("type").and_then(Value::as_str);
    let bad = |what: &str| Err(format!("{path}: expected {what}, got {v}"));
    match ty {
        Some("null") if !v.is_null() => return bad("null"),
        Some("string") if !v.is_string() => return bad("string"),
        // Perl often prints integers as strings (`/cluster/nextid` does), so those pass.
        Some("integer")
            if !(v.is_i64()
                || v.is_u64()
                || v.as_str()
                    .is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))) =>
        {
            return bad("integer");
        }
        Some("number") if !v.is_number() => return bad("number"),
        Some("boolean") if !(v.is_boolean() || matches!(v.as_i64(), Some(0 | 1))) => {
            return bad("boolean");
        }
        Some("array") => {
            let Some(items) = v.as_array() else {
                return bad("array");
            };
            if let Some(is) = s.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check_return(is, item, &format!("{path}[{i}]"))?;
                }
            }
        }
        Some("object") => {
            let Some(obj) = v.as_object() else {
                return bad("object");
            };
            let empty = Map::new();
            let props = s
                .get("properties")
                .and_then(Value::as_object)
                .unwrap_or(&empty);
            for (k, ps) in props {
                if k.ends_with("[n]") {
                    continue;
                }
                if !is_true(ps.get("optional")) && !obj.contains_key(k) {
                    return Err(format!(
                        "{path}.{k}: missing, and the schema does not mark it optional"
                    ));
                }
            }
            for (k, val) in obj {
                if let Some(ps) = property(props, k)
                    && (!val.is_null() || ps.get("type").and_then(Value::as_str) == Some("null"))
                {
                    check_return(ps, val, &format!("{path}.{k}"))?;
                }
            }
        }
        _ => {}
    }
    if let (Some(en), Some(t)) = (s.get("enum").and_then(Value::as_array), v.as_str())
        && !en.iter().any(|e| e.as_str() == Some(t))
    {
        return Err(format!("{path}: '{t}' is not one of the enumeration"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parameter_messages_match_proxmox() {
        let int = json!({"type": "integer", "minimum": 100});
        assert_eq!(
            check_value(&int, &json!("abc")).unwrap_err(),
            "type check ('integer') failed - got 'abc'"
        );
        assert_eq!(
            check_value(&int, &json!("5")).unwrap_err(),
            "value must have a minimum value of 100"
        );
        let en = json!({"type": "string", "enum": ["a", "b"]});
        assert_eq!(
            check_value(&en, &json!("c")).unwrap_err(),
            "value 'c' does not have a value in the enumeration 'a, b'"
        );
        let b = json!({"type": "boolean"});
        assert!(check_value(&b, &json!("1")).is_ok());
        assert!(check_value(&b, &json!("yes")).is_err());
    }

    #[test]
    fn property_strings_are_checked_by_their_inline_format() {
        let fmt = json!({
            "name": {"type": "string"},
            "mtu": {"type": "integer", "optional": 1, "minimum": 64},
            "volume": {"type": "string", "optional": 1, "default_key": 1},
        });
        let fmt = fmt.as_object().unwrap();
        assert!(check_property_string(fmt, "name=eth0,mtu=1500").is_ok());
        let e = check_property_string(fmt, "mtu=10").unwrap_err();
        assert!(
            e.contains("mtu: value must have a minimum value of 64"),
            "{e}"
        );
        assert!(e.contains("name: property is missing"), "{e}");
    }

    #[test]
    fn perl_regexes_translate() {
        let re = perl_regex("(?^:(?^:(discard|noatime))(;(?^:(discard|noatime)))*)").unwrap();
        assert!(re.is_match("discard;noatime"));
        assert!(!re.is_match("exec"));
    }
}
