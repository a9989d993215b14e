//! OpenSSH's `known_hosts` file: read (plain and hashed entries, wildcard and negated
//! patterns, `@revoked` markers), checked against the key a host presents, and appended to
//! when the user accepts new keys.
//!
//! We parse the file ourselves rather than through libssh2's knownhost API so that a
//! changed key can be reported with its file and line, and so that a line libssh2 cannot
//! parse (a certificate authority, a security-key type) is skipped as OpenSSH skips it
//! instead of failing the whole file.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use sha1::{Digest, Sha1};
use sha2::Sha256;

/// The fingerprint OpenSSH prints for a key blob: `SHA256:` and unpadded base64.
pub fn fingerprint(blob: &[u8]) -> String {
    format!("SHA256:{}", STANDARD_NO_PAD.encode(Sha256::digest(blob)))
}

/// The key type named inside a key blob (its first SSH string), e.g. `ssh-ed25519`.
pub fn key_type(blob: &[u8]) -> Option<&str> {
    let len = u32::from_be_bytes(blob.get(..4)?.try_into().ok()?) as usize;
    std::str::from_utf8(blob.get(4..4 + len)?).ok()
}

/// How `host` on `port` is written in `known_hosts`: bare for port 22, else `[host]:port`.
pub fn host_entry_name(host: &str, port: u16) -> String {
    if port == 22 {
        host.to_string()
    } else {
        format!("[{host}]:{port}")
    }
}

/// A host presenting a key other than the one on file (boxed in
/// [`TransportError::ChangedHostKey`](crate::transport::TransportError::ChangedHostKey)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyChange {
    /// `host:port`.
    pub target: String,
    /// The host as `known_hosts` names it (`[host]:port` for ports other than 22).
    pub entry: String,
    /// The presented key's type.
    pub key_type: String,
    /// The presented key's fingerprint.
    pub fingerprint: String,
    /// The type of the key on file.
    pub known_type: String,
    /// The file that holds the old key.
    pub known_hosts: PathBuf,
    /// Its 1-based line.
    pub line: usize,
}

/// What `known_hosts` says about a presented key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostKeyStatus {
    /// An entry for this host holds exactly this key.
    Known,
    /// No entry for this host holds a key of any type.
    Unknown,
    /// Entries for this host hold other keys; the first such entry's line (1-based).
    Changed {
        /// Line of the first entry for this host.
        line: usize,
        /// The key type on that line.
        known_type: String,
    },
    /// The key is marked `@revoked` at this line.
    Revoked {
        /// Line of the `@revoked` entry.
        line: usize,
    },
}

/// The host part of one entry.
#[derive(Debug, Clone)]
enum Hosts {
    /// Comma-separated patterns (`*`, `?`, leading `!` negates).
    Patterns(Vec<String>),
    /// `|1|salt|hash`: HMAC-SHA1 of the entry name keyed with the salt.
    Hashed { salt: Vec<u8>, hash: Vec<u8> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marker {
    None,
    Revoked,
    /// `@cert-authority` lines: libssh2 does not do certificates, so these never match.
    CertAuthority,
}

#[derive(Debug, Clone)]
struct Entry {
    line: usize,
    marker: Marker,
    hosts: Hosts,
    key_type: String,
    blob: Vec<u8>,
}

/// The entries of one `known_hosts` file.
#[derive(Debug, Clone)]
pub struct KnownHosts {
    path: PathBuf,
    entries: Vec<Entry>,
}

impl KnownHosts {
    /// Reads `path`; a missing file is an empty one. Lines that do not parse are skipped,
    /// as OpenSSH skips them.
    pub fn load(path: &Path) -> io::Result<Self> {
        let text = match fs::read(path) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        Ok(Self::parse(path, &text))
    }

    /// Parses `text` as the content of `path`.
    pub fn parse(path: &Path, text: &str) -> Self {
        let entries = text
            .lines()
            .enumerate()
            .filter_map(|(i, line)| parse_line(i + 1, line))
            .collect();
        KnownHosts {
            path: path.to_path_buf(),
            entries,
        }
    }

    /// The file these entries came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks the key `blob` presented by `host` on `port`.
    pub fn check(&self, host: &str, port: u16, blob: &[u8]) -> HostKeyStatus {
        let name = host_entry_name(host, port);
        let matching: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| e.marker != Marker::CertAuthority && e.matches(&name))
            .collect();
        // A revoked key is refused even when another line also lists it as valid.
        if let Some(e) = matching
            .iter()
            .find(|e| e.marker == Marker::Revoked && e.blob == blob)
        {
            return HostKeyStatus::Revoked { line: e.line };
        }
        let valid: Vec<&&Entry> = matching
            .iter()
            .filter(|e| e.marker == Marker::None)
            .collect();
        if valid.iter().any(|e| e.blob == blob) {
            return HostKeyStatus::Known;
        }
        // A different key, of the same type or another: a host that is known must
        // present a key we know. Accepting another type would let an attacker who
        // offers only a type we have not seen pass as a new host.
        let presented = key_type(blob).unwrap_or("");
        let first = valid
            .iter()
            .find(|e| e.key_type == presented)
            .or_else(|| valid.first());
        match first {
            Some(e) => HostKeyStatus::Changed {
                line: e.line,
                known_type: e.key_type.clone(),
            },
            None => HostKeyStatus::Unknown,
        }
    }

    /// Key types known for `host` on `port`, in file order, without repeats: the host key
    /// algorithms to ask the server for first, so it presents a key we can check.
    pub fn known_types(&self, host: &str, port: u16) -> Vec<String> {
        let name = host_entry_name(host, port);
        let mut types: Vec<String> = Vec::new();
        for e in &self.entries {
            if e.marker == Marker::None && e.matches(&name) && !types.contains(&e.key_type) {
                types.push(e.key_type.clone());
            }
        }
        types
    }

    /// Appends an entry for `host` on `port` with key `blob` to the file (creating it and
    /// its directory, mode 0700, when missing) and to these entries.
    pub fn append(&mut self, host: &str, port: u16, blob: &[u8]) -> io::Result<()> {
        let key_type = key_type(blob)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed host key"))?
            .to_string();
        let name = host_entry_name(host, port);
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.exists()
        {
            fs::create_dir_all(dir)?;
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
        }
        let existing = fs::read(&self.path).unwrap_or_default();
        let mut line = String::new();
        if !existing.is_empty() && !existing.ends_with(b"\n") {
            line.push('\n');
        }
        line += &format!("{name} {key_type} {}\n", STANDARD.encode(blob));
        // One write with O_APPEND, so connections to several hosts at once do not
        // interleave their lines.
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&self.path)?
            .write_all(line.as_bytes())?;
        let line_no = String::from_utf8_lossy(&existing).lines().count() + 1;
        self.entries.push(Entry {
            line: line_no,
            marker: Marker::None,
            hosts: Hosts::Patterns(vec![name]),
            key_type,
            blob: blob.to_vec(),
        });
        Ok(())
    }
}

impl Entry {
    fn matches(&self, name: &str) -> bool {
        match &self.hosts {
            Hosts::Hashed { salt, hash } => hmac_sha1(salt, name.as_bytes()) == hash[..],
            Hosts::Patterns(patterns) => {
                let name = name.to_ascii_lowercase();
                let mut matched = false;
                for p in patterns {
                    if let Some(negated) = p.strip_prefix('!') {
                        if wildcard_match(&negated.to_ascii_lowercase(), &name) {
                            return false;
                        }
                    } else if wildcard_match(&p.to_ascii_lowercase(), &name) {
                        matched = true;
                    }
                }
                matched
            }
        }
    }
}

fn parse_line(line: usize, text: &str) -> Option<Entry> {
    let mut fields = text.split_whitespace();
    let mut first = fields.next()?;
    if first.starts_with('#') {
        return None;
    }
    let marker = match first {
        "@revoked" => Marker::Revoked,
        "@cert-authority" => Marker::CertAuthority,
        m if m.starts_with('@') => return None,
        _ => Marker::None,
    };
    if marker != Marker::None {
        first = fields.next()?;
    }
    let kind = fields.next()?.to_string();
    let blob = STANDARD.decode(fields.next()?).ok()?;
    // The type outside must agree with the type inside the blob, or the line is corrupt.
    if key_type(&blob)? != kind {
        return None;
    }
    let hosts = if let Some(rest) = first.strip_prefix("|1|") {
        let (salt, hash) = rest.split_once('|')?;
        Hosts::Hashed {
            salt: STANDARD.decode(salt).ok()?,
            hash: STANDARD.decode(hash).ok()?,
        }
    } else {
        Hosts::Patterns(first.split(',').map(str::to_string).collect())
    };
    Some(Entry {
        line,
        marker,
        hosts,
        key_type: kind,
        blob,
    })
}

/// OpenSSH's glob: `*` any run of characters, `?` any one character.
fn wildcard_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// HMAC-SHA1 (RFC 2104), the hash of hashed `known_hosts` names.
fn hmac_sha1(key: &[u8], message: &[u8]) -> Vec<u8> {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..20].copy_from_slice(&Sha1::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha1::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(message);
    let mut outer = Sha1::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A syntactically valid ed25519 blob whose 32 key bytes are all `b`.
    fn blob(b: u8) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&11u32.to_be_bytes());
        v.extend_from_slice(b"ssh-ed25519");
        v.extend_from_slice(&32u32.to_be_bytes());
        v.extend_from_slice(&[b; 32]);
        v
    }

    fn line(hosts: &str, b: u8) -> String {
        format!("{hosts} ssh-ed25519 {}\n", STANDARD.encode(blob(b)))
    }

    fn hashed(name: &str, salt: &[u8]) -> String {
        format!(
            "|1|{}|{}",
            STANDARD.encode(salt),
            STANDARD.encode(hmac_sha1(salt, name.as_bytes()))
        )
    }

    #[test]
    fn hmac_sha1_matches_rfc_2202() {
        // RFC 2202 test case 2.
        let mac = hmac_sha1(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(hex::encode(mac), "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79");
    }

    #[test]
    fn plain_wildcard_negated_and_port_forms() {
        let text = format!(
            "# comment\n\n{}{}{}{}",
            line("a.example,10.0.0.1", 1),
            line("[b.example]:2222", 2),
            line("*.lab,!bad.lab", 3),
            line("garbage-without-key", 4).replace(" ssh-ed25519 ", " "),
        );
        let kh = KnownHosts::parse(Path::new("kh"), &text);
        assert_eq!(kh.check("10.0.0.1", 22, &blob(1)), HostKeyStatus::Known);
        assert_eq!(kh.check("A.EXAMPLE", 22, &blob(1)), HostKeyStatus::Known);
        // Port 22 entries do not cover other ports, and vice versa.
        assert_eq!(
            kh.check("a.example", 2222, &blob(1)),
            HostKeyStatus::Unknown
        );
        assert_eq!(kh.check("b.example", 2222, &blob(2)), HostKeyStatus::Known);
        assert_eq!(kh.check("b.example", 22, &blob(2)), HostKeyStatus::Unknown);
        assert_eq!(kh.check("x.lab", 22, &blob(3)), HostKeyStatus::Known);
        assert_eq!(kh.check("bad.lab", 22, &blob(3)), HostKeyStatus::Unknown);
        assert_eq!(
            kh.check("a.example", 22, &blob(9)),
            HostKeyStatus::Changed {
                line: 3,
                known_type: "ssh-ed25519".into()
            }
        );
    }

    #[test]
    fn hashed_entries_match_their_name_only() {
        let text = line(&hashed("[10.9.9.9]:2200", b"0123456789abcdefghij"), 5);
        let kh = KnownHosts::parse(Path::new("kh"), &text);
        assert_eq!(kh.check("10.9.9.9", 2200, &blob(5)), HostKeyStatus::Known);
        assert_eq!(kh.check("10.9.9.9", 22, &blob(5)), HostKeyStatus::Unknown);
        assert_eq!(
            kh.check("10.9.9.9", 2200, &blob(6)),
            HostKeyStatus::Changed {
                line: 1,
                known_type: "ssh-ed25519".into()
            }
        );
    }

    #[test]
    fn revoked_wins_and_cert_authority_is_ignored() {
        let text = format!(
            "{}@revoked {}@cert-authority {}",
            line("h", 1),
            line("*", 1),
            line("h2", 2)
        );
        let kh = KnownHosts::parse(Path::new("kh"), &text);
        assert_eq!(
            kh.check("h", 22, &blob(1)),
            HostKeyStatus::Revoked { line: 2 }
        );
        assert_eq!(kh.check("h2", 22, &blob(2)), HostKeyStatus::Unknown);
    }

    #[test]
    fn a_mismatched_type_inside_the_blob_is_skipped() {
        let text = format!("h ssh-rsa {}\n", STANDARD.encode(blob(1)));
        let kh = KnownHosts::parse(Path::new("kh"), &text);
        assert_eq!(kh.check("h", 22, &blob(1)), HostKeyStatus::Unknown);
    }

    #[test]
    fn append_writes_the_openssh_form_and_counts_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/known_hosts");
        let mut kh = KnownHosts::load(&path).unwrap();
        kh.append("127.0.0.1", 2022, &blob(7)).unwrap();
        kh.append("h", 22, &blob(8)).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("[127.0.0.1]:2022 ssh-ed25519 "), "{text}");
        let again = KnownHosts::load(&path).unwrap();
        assert_eq!(
            again.check("127.0.0.1", 2022, &blob(7)),
            HostKeyStatus::Known
        );
        assert_eq!(
            again.check("h", 22, &blob(9)),
            HostKeyStatus::Changed {
                line: 2,
                known_type: "ssh-ed25519".into()
            }
        );
        assert_eq!(kh.known_types("h", 22), vec!["ssh-ed25519".to_string()]);
    }

    #[test]
    fn fingerprint_is_unpadded_base64_sha256() {
        let fp = fingerprint(b"abc");
        assert_eq!(fp, "SHA256:ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0");
    }

    #[test]
    fn wildcards() {
        assert!(wildcard_match("*", ""));
        assert!(wildcard_match("10.0.0.?", "10.0.0.7"));
        assert!(!wildcard_match("10.0.0.?", "10.0.0.17"));
        assert!(wildcard_match("*.a*.c", "x.ab.c"));
        assert!(!wildcard_match("a*b", "ac"));
    }
}
