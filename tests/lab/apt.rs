//! Keyed APT sources against a real container and real apt: a repository on the lab's
//! mirror signed (InRelease, Release.gpg) with a key this test makes with gpg. The right
//! key, pinned by its fingerprint, installs from it; a key that does not have the pinned
//! fingerprint is refused before anything is written; a repository signed by another key
//! and one not signed at all fail in `apt-get update` with apt's own words, as on a real
//! box. Needs the lab (`scripts/test` brings it up).

use crate::guestlab;

use guestlab::{Deb, GpgKey, Guest, apt_repo};

/// A flat repository `name` on the guest's mirror holding the package `package` 1.0,
/// signed by `key` (or unsigned when `None`, a `Release` without signatures); its URL.
fn repo(g: &Guest, name: &str, package: &str, key: Option<&GpgKey>) -> String {
    let dir = g.mirror_dir.join(name);
    let script = format!("#!/bin/sh\necho {package}\n");
    let bin = format!("/usr/bin/{package}");
    apt_repo(
        &dir,
        "",
        &[Deb {
            name: package,
            version: "1.0",
            files: &[(bin.as_str(), script.as_str(), 0o755)],
        }],
    );
    match key {
        Some(k) => k.sign_repo(&dir.join("apt")),
        None => guestlab::release(&dir.join("apt")),
    }
    format!("{}/{name}/apt/", g.mirror_url)
}

/// The container's part of the inventory: one keyed source and the package from it.
fn body(uri: &str, key_url: &str, fingerprint: &str, package: &str) -> String {
    format!(
        "        apt_sources:
          - name: keyed
            uri: {uri}
            suites: [\"./\"]
            key: {{ url: {key_url}, fingerprint: \"{fingerprint}\" }}
        packages: [{package}]
"
    )
}

#[test]
fn the_pinned_key_installs_a_wrong_one_is_refused_and_apt_rejects_other_signatures() {
    let g = Guest::new("aptkey");
    let signer = GpgKey::new("signer@example.invalid");
    let other = GpgKey::new("other@example.invalid");
    std::fs::write(g.mirror_dir.join("signer.asc"), &signer.public).unwrap();
    std::fs::write(g.mirror_dir.join("other.asc"), &other.public).unwrap();
    let signer_url = format!("{}/signer.asc", g.mirror_url);
    let other_url = format!("{}/other.asc", g.mirror_url);

    // The pinned key, fetched by the container: the source, its keyring, the package.
    let good = repo(&g, "good", "provision-keyed", Some(&signer));
    // Written as people copy fingerprints: grouped, lower case.
    let grouped: String = signer
        .fingerprint
        .to_lowercase()
        .as_bytes()
        .chunks(4)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect::<Vec<_>>()
        .join(" ");
    g.inventory(&body(&good, &signer_url, &grouped, "provision-keyed"));
    let (plan, _) = g.expect(&["plan", "--detailed-exitcode"], 2);
    assert!(plan.contains("+ apt_source keyed"), "{plan}");
    assert!(
        plan.contains(&format!(
            "/etc/apt/keyrings/keyed.gpg (key {} from {signer_url})",
            signer.fingerprint
        )),
        "{plan}"
    );
    let (out, err) = g.expect(&["apply", "--yes"], 0);
    assert!(out.contains("Apply complete"), "{out}\n{err}");
    assert_eq!(g.sh("provision-keyed"), "provision-keyed\n");
    let sources = g.sh("cat /etc/apt/sources.list.d/keyed.sources");
    assert!(
        sources.contains("Signed-By: /etc/apt/keyrings/keyed.gpg\n")
            && !sources.contains("Trusted"),
        "{sources}"
    );
    // The keyring holds exactly the pinned key, as gpg reads it.
    let keyring = g.ct.rootfs().join("etc/apt/keyrings/keyed.gpg");
    let shown = guestlab::host(&format!(
        "gpg --with-colons --show-keys {}",
        keyring.display()
    ));
    let fprs: Vec<&str> = shown
        .lines()
        .filter_map(|l| l.strip_prefix("fpr:::::::::"))
        .collect();
    assert_eq!(fprs, [format!("{}:", signer.fingerprint)], "{shown}");
    g.expect(&["check"], 0);

    // A key at the URL without the pinned fingerprint: refused, nothing written.
    g.sh("rm -f /etc/apt/sources.list.d/keyed.sources /etc/apt/keyrings/keyed.gpg");
    g.inventory(&body(
        &good,
        &other_url,
        &signer.fingerprint,
        "provision-keyed",
    ));
    let (out, err) = g.expect(&["apply", "--yes"], 1);
    let text = format!("{out}{err}");
    assert!(
        text.contains(&format!(
            "it has fingerprint {}, the inventory pins {}",
            other.fingerprint, signer.fingerprint
        )),
        "{text}"
    );
    assert_eq!(
        g.sh("ls /etc/apt/keyrings/ /etc/apt/sources.list.d/ | grep -c keyed || true"),
        "0\n"
    );

    // The repository is signed by a key other than the (correctly pinned) one apt is
    // given: apt's gpgv refuses it, and so does the apply.
    let foreign = repo(&g, "foreign", "provision-foreign", Some(&other));
    g.inventory(&body(
        &foreign,
        &signer_url,
        &signer.fingerprint,
        "provision-foreign",
    ));
    let (out, err) = g.expect(&["apply", "--yes"], 1);
    let text = format!("{out}{err}");
    assert!(text.contains("NO_PUBKEY"), "{text}");
    assert!(text.contains("is not signed"), "{text}");
    assert!(text.contains("apt-get update"), "{text}");
    assert_eq!(g.sh("command -v provision-foreign || echo none"), "none\n");

    // Not signed at all.
    g.sh("rm -f /etc/apt/sources.list.d/keyed.sources");
    let unsigned = repo(&g, "unsigned", "provision-unsigned", None);
    g.inventory(&body(
        &unsigned,
        &signer_url,
        &signer.fingerprint,
        "provision-unsigned",
    ));
    let (out, err) = g.expect(&["apply", "--yes"], 1);
    let text = format!("{out}{err}");
    assert!(text.contains("is not signed"), "{text}");
    assert_eq!(g.sh("command -v provision-unsigned || echo none"), "none\n");
}
