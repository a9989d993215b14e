//! Proxmox's formats in `crates/pve`: container configs (`lxc/<vmid>.conf`), property
//! strings, UPIDs and the option normalisation. Invariants: never a panic; what parses
//! prints to text that parses back to the same value (config, property strings, UPIDs);
//! printing a parsed value is stable.

#![no_main]

use libfuzzer_sys::fuzz_target;
use pve::config::{CtConfig, Section};
use pve::propstr::{self, DEV, FEATURES, Format, MP, NET, ROOTFS};
use pve::upid::Upid;
use pve::{normalize, options};

/// parse → print → parse gives the same map, and a canonical form still parses.
fn property_string(key: &str, fmt: &Format, value: &str) {
    let Ok(map) = propstr::parse(fmt, value) else {
        return;
    };
    let printed = propstr::print(fmt, &map);
    let again = propstr::parse(fmt, &printed)
        .unwrap_or_else(|e| panic!("{value:?} printed as {printed:?}, which fails: {e}"));
    // As Proxmox, a size is printed in its largest even unit (`8192M` as `8G`).
    let mut map = map;
    if let Some(bytes) = map.get("size").and_then(|s| propstr::parse_size(s)) {
        map.insert("size".into(), propstr::format_size(bytes));
    }
    assert_eq!(map, again, "{value:?} printed as {printed:?}");
    let canonical = normalize::canonical(key, value);
    if let Err(e) = propstr::parse(fmt, &canonical) {
        panic!("{value:?} has the canonical form {canonical:?}, which fails: {e}");
    }
}

/// Every section with its name.
fn sections(conf: &CtConfig) -> impl Iterator<Item = (&str, &Section)> {
    [("main", &conf.main), ("pending", &conf.pending)]
        .into_iter()
        .chain(conf.snapshots.iter().map(|(n, s)| (n.as_str(), s)))
}

/// The sections as a round trip keeps them. Proxmox's format does not keep a description's
/// trailing newlines (`description: x` reads as `x`, is written as `#x` and reads back as
/// `x\n`), nor a `%` before two hex digits (`encode_text` leaves `%` alone, so `%0A` reads
/// back as a newline): those are left out of the comparison.
fn comparable(conf: &CtConfig, descriptions: bool) -> Vec<(String, Section)> {
    sections(conf)
        .map(|(name, section)| {
            let mut section = section.clone();
            if let Some(d) = section.props.remove("description") {
                let d = d.trim_end_matches('\n');
                if descriptions && !d.is_empty() {
                    section.props.insert("description".into(), d.to_string());
                }
            }
            (name.to_string(), section)
        })
        .collect()
}

/// True when `text` holds `%XX`, which Proxmox writes as is and reads back decoded.
fn has_escape(text: &str) -> bool {
    let b = text.as_bytes();
    (0..b.len()).any(|i| {
        b[i] == b'%'
            && b.len() > i + 2
            && b[i + 1].is_ascii_hexdigit()
            && b[i + 2].is_ascii_hexdigit()
    })
}

/// The per-option helpers never panic, whatever the key and value.
fn option(key: &str, value: &str) {
    let _ = normalize::canonical(key, value);
    let _ = normalize::same(key, value, Some(value));
    let _ = normalize::same(key, value, None);
    let _ = options::check_type(key, value, pve::Version::Pve9);
    let _ = options::verify(key, value, pve::Version::Pve8);
    let _ = options::to_json(key, value);
    let _ = options::new_disk(value);
    let _ = options::MountKind::of(value);
    if let Some(bytes) = propstr::parse_size(value) {
        let _ = propstr::format_size(bytes);
    }
    let tags = options::unique_tags(value);
    assert_eq!(options::unique_tags(&tags), tags, "tags of {value:?}");
    if let Some(fmt) = propstr::format_of(key) {
        property_string(key, &fmt, value);
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(conf) = CtConfig::parse(text) {
        let raw = conf.to_raw();
        let again = CtConfig::parse(&raw)
            .unwrap_or_else(|e| panic!("{text:?} wrote {raw:?}, which fails: {e}"));
        let escapes =
            sections(&conf).any(|(_, s)| s.props.get("description").is_some_and(|d| has_escape(d)));
        // As Proxmox, an `unusedN` whose volume a mount point uses is not written.
        let unused = conf.main.props.keys().any(|k| k.starts_with("unused"));
        if !unused {
            assert_eq!(
                comparable(&conf, !escapes),
                comparable(&again, !escapes),
                "{text:?} wrote {raw:?}"
            );
        }
        if !escapes {
            assert_eq!(again.to_raw(), raw, "writing is not stable for {text:?}");
        }
        let _ = conf.pending_delete();
        for (_, section) in sections(&conf) {
            for (k, v) in &section.props {
                option(k, v);
            }
        }
    }
    for (key, fmt) in [
        ("net0", NET),
        ("mp0", MP),
        ("rootfs", ROOTFS),
        ("dev0", DEV),
        ("features", FEATURES),
    ] {
        property_string(key, &fmt, text);
    }
    if let Some(upid) = Upid::decode(text) {
        let encoded = upid.encode();
        assert_eq!(
            Upid::decode(&encoded).as_ref(),
            Some(&upid),
            "{text:?} → {encoded:?}"
        );
    }
});
