//! Just enough OpenPGP to pin an APT signing key by its fingerprint: undo ASCII armor,
//! walk the packets of a key file (RFC 4880 §4.2 headers, RFC 9580 for v6), and compute
//! each primary key's fingerprint (v4: SHA-1 over `0x99 || len16 || body`; v6: SHA-256
//! over `0x9B || len32 || body`). Nothing is verified here: apt's own gpgv verifies the
//! repository's signatures against the keyring this writes. A full OpenPGP crate would
//! bring a second crypto stack for two hashes of one packet.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use sha1::Digest;

/// Packet tag of a primary public key.
const PUBLIC_KEY: u8 = 6;

/// Why a key file cannot be read as OpenPGP keys.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an OpenPGP public key: {0}")]
pub struct KeyError(pub String);

/// One transferable public key: its primary key's fingerprint and every packet of it
/// (user IDs, signatures, subkeys), as bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    /// Upper-case hex, as `gpg --with-colons` prints it in `fpr`.
    pub fingerprint: String,
    /// The key's packets, binary (what a `.gpg` keyring holds).
    pub bytes: Vec<u8>,
}

/// The keys in `data`, armored (`-----BEGIN PGP PUBLIC KEY BLOCK-----`) or binary.
pub fn keys(data: &[u8]) -> Result<Vec<PublicKey>, KeyError> {
    let binary = match std::str::from_utf8(data) {
        Ok(text) if text.contains("-----BEGIN PGP PUBLIC KEY BLOCK-----") => dearmor(text)?,
        _ => data.to_vec(),
    };
    let mut out: Vec<PublicKey> = Vec::new();
    let mut at = 0;
    while at < binary.len() {
        let (tag, header, body) = packet(&binary[at..])?;
        let whole = &binary[at..at + header + body.len()];
        if tag == PUBLIC_KEY {
            out.push(PublicKey {
                fingerprint: fingerprint(body)?,
                bytes: whole.to_vec(),
            });
        } else if let Some(last) = out.last_mut() {
            last.bytes.extend_from_slice(whole);
        } else {
            return Err(KeyError(format!(
                "the first packet is of type {tag}, not a public key"
            )));
        }
        at += header + body.len();
    }
    if out.is_empty() {
        return Err(KeyError("it holds no key".into()));
    }
    Ok(out)
}

/// Normalises a fingerprint as written by people (`EB69 3B30 ...`, lower case, `0x`).
pub fn normalize(fingerprint: &str) -> String {
    fingerprint
        .trim()
        .trim_start_matches("0x")
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect::<String>()
        .to_ascii_uppercase()
}

/// The base64 between the armor's header block and its checksum line.
fn dearmor(text: &str) -> Result<Vec<u8>, KeyError> {
    let mut lines = text
        .lines()
        .map(str::trim)
        .skip_while(|l| !l.starts_with("-----BEGIN PGP PUBLIC KEY BLOCK-----"))
        .skip(1);
    // Armor headers (`Version: ...`) end at the first empty line.
    let mut body = String::new();
    let mut in_headers = true;
    for line in lines.by_ref() {
        if line.starts_with("-----END PGP") {
            break;
        }
        if in_headers {
            if line.is_empty() {
                in_headers = false;
            } else if !line.contains(": ") {
                in_headers = false;
                body.push_str(line);
            }
            continue;
        }
        if line.starts_with('=') {
            continue; // the CRC-24 line; apt's gpgv does not need it either
        }
        body.push_str(line);
    }
    STANDARD
        .decode(body.as_bytes())
        .map_err(|e| KeyError(format!("its armor is not base64: {e}")))
}

/// The tag, header length and body of the packet at the start of `data`.
fn packet(data: &[u8]) -> Result<(u8, usize, &[u8]), KeyError> {
    let short = || KeyError("a packet is cut short".into());
    let first = *data.first().ok_or_else(short)?;
    if first & 0x80 == 0 {
        return Err(KeyError("a packet header is malformed".into()));
    }
    let (tag, header, len) = if first & 0x40 != 0 {
        // New format: one, two or five length octets (partial lengths are not used in keys).
        let tag = first & 0x3f;
        let l0 = *data.get(1).ok_or_else(short)? as usize;
        match l0 {
            0..=191 => (tag, 2, l0),
            192..=223 => {
                let l1 = *data.get(2).ok_or_else(short)? as usize;
                (tag, 3, ((l0 - 192) << 8) + l1 + 192)
            }
            255 => {
                let b = data.get(2..6).ok_or_else(short)?;
                (
                    tag,
                    6,
                    u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize,
                )
            }
            _ => return Err(KeyError("a packet has a partial length".into())),
        }
    } else {
        let tag = (first >> 2) & 0x0f;
        match first & 0x03 {
            0 => (tag, 2, *data.get(1).ok_or_else(short)? as usize),
            1 => {
                let b = data.get(1..3).ok_or_else(short)?;
                (tag, 3, u16::from_be_bytes([b[0], b[1]]) as usize)
            }
            2 => {
                let b = data.get(1..5).ok_or_else(short)?;
                (
                    tag,
                    5,
                    u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize,
                )
            }
            _ => return Err(KeyError("a packet has an indeterminate length".into())),
        }
    };
    let body = data.get(header..header + len).ok_or_else(short)?;
    Ok((tag, header, body))
}

/// The fingerprint of a public key packet's body, by its version.
fn fingerprint(body: &[u8]) -> Result<String, KeyError> {
    match body.first() {
        Some(4) => {
            let len =
                u16::try_from(body.len()).map_err(|_| KeyError("a key is too long".into()))?;
            let mut h = sha1::Sha1::new();
            h.update([0x99]);
            h.update(len.to_be_bytes());
            h.update(body);
            Ok(hex::encode_upper(h.finalize()))
        }
        Some(6) => {
            let len =
                u32::try_from(body.len()).map_err(|_| KeyError("a key is too long".into()))?;
            let mut h = sha2::Sha256::new();
            h.update([0x9b]);
            h.update(len.to_be_bytes());
            h.update(body);
            Ok(hex::encode_upper(h.finalize()))
        }
        Some(v) => Err(KeyError(format!("key version {v} is not supported"))),
        None => Err(KeyError("a key packet is empty".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_as_people_write_them_compare_equal() {
        assert_eq!(
            normalize("0xeb69 3b30 35cd 5710 e231  e123 a4b4 6996 3bf8 63cc"),
            "EB693B3035CD5710E231E123A4B469963BF863CC"
        );
    }

    const RSA: &[u8] = include_bytes!("../tests/fixtures/apt/rsa.asc");
    const ED: &[u8] = include_bytes!("../tests/fixtures/apt/ed25519.gpg");

    /// The fingerprints gpg printed for the fixtures (tests/fixtures/apt/README.md).
    #[test]
    fn fingerprints_are_gpgs() {
        let rsa = keys(RSA).unwrap();
        assert_eq!(rsa.len(), 1);
        assert_eq!(
            rsa[0].fingerprint,
            "A157F188ED03A751D72FF2697CD296340C000B5D"
        );
        let ed = keys(ED).unwrap();
        assert_eq!(
            ed[0].fingerprint,
            "16EDC3750535380DE4F567DC9D0E79D33AA7DACE"
        );
        // The binary form of a key is what its armor holds.
        assert_eq!(keys(&ed[0].bytes).unwrap(), ed);
    }

    #[test]
    fn a_file_of_two_keys_splits_into_each_with_its_own_packets() {
        let mut both = keys(RSA).unwrap()[0].bytes.clone();
        both.extend_from_slice(ED);
        let k = keys(&both).unwrap();
        let f: Vec<&str> = k.iter().map(|k| k.fingerprint.as_str()).collect();
        assert_eq!(
            f,
            [
                "A157F188ED03A751D72FF2697CD296340C000B5D",
                "16EDC3750535380DE4F567DC9D0E79D33AA7DACE"
            ]
        );
        assert_eq!(k[1].bytes, ED);
    }

    #[test]
    fn garbage_is_refused_not_misread() {
        assert!(keys(b"hello").is_err());
        assert!(keys(b"").is_err());
        // A user ID packet first: no key to attach it to.
        assert!(keys(&[0xb4, 0x01, b'x']).is_err());
        // Cut short.
        assert!(keys(&[0x99, 0x01]).is_err());
    }
}
