//! Inventory bytes → what `provision validate` does: parse, validate against the built-in
//! roles, expand into desired resources. Invariants: never a panic (or a hang: libFuzzer's
//! `-timeout`), and every error points into the file with `file:line:col`.
//!
//! The file system is not touched beyond the built-in templates and roles: `paths:` is
//! cleared, so the fuzzer never reads a folder it names.

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use provision::diagnostic::{Diagnostic, source_lines};
use provision::engine::desired::{Library, desired_state};
use provision::inventory::load::parse_bytes;
use provision::inventory::validate::validate;
use provision::inventory::{Loaded, node::Paths};

const FILE: &str = "fuzz.yaml";

/// The built-in templates and roles, loaded once (they do not depend on the input).
fn library(loaded: &Loaded) -> &'static Library {
    static LIBRARY: OnceLock<Library> = OnceLock::new();
    LIBRARY.get_or_init(|| Library::load(loaded).expect("the built-in roles load"))
}

/// Panics unless `d` names a place in the file, as the CLI must for every bad input.
fn assert_located(d: &Diagnostic, source: &str) {
    let rendered = d.render(false);
    let Some(loc) = &d.location else {
        panic!("an error without file:line:col:\n{rendered}");
    };
    // A position may be one past the last line (the end of the file), never further.
    let lines = source_lines(source).count();
    assert!(
        loc.line >= 1 && loc.line <= lines + 1 && loc.column >= 1,
        "position {}:{} outside the file ({lines} lines):\n{rendered}",
        loc.line,
        loc.column
    );
    let at = format!("{FILE}:{}:{}", loc.line, loc.column);
    assert!(rendered.contains(&at), "rendering lacks {at}:\n{rendered}");
}

fuzz_target!(|data: &[u8]| {
    let path = Path::new(FILE);
    let (mut inventory, source) = match parse_bytes(path, data) {
        Ok(parsed) => parsed,
        Err(d) => {
            let text = String::from_utf8_lossy(data);
            return assert_located(&d, &text);
        }
    };
    inventory.paths = Paths::default();
    let loaded = Loaded {
        path: PathBuf::from(FILE),
        base_dir: PathBuf::from("/nonexistent/provision-fuzz"),
        source,
        inventory,
    };
    let library = library(&loaded);
    if let Err(ds) = validate(&loaded, &library.roles.names()) {
        assert!(!ds.0.is_empty(), "validation failed without an error");
        for d in &ds.0 {
            assert_located(d, &loaded.source);
        }
        return;
    }
    if let Err(ds) = desired_state(&loaded, library, &|_| None) {
        assert!(!ds.0.is_empty(), "expansion failed without an error");
        for d in &ds.0 {
            assert_located(d, &loaded.source);
        }
    }
});
