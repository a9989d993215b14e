//! Authentication as pveproxy does it: API tokens (`Authorization: PVEAPIToken=USER@REALM!ID=SECRET`)
//! and tickets from `POST /access/ticket` (cookie `PVEAuthCookie`, plus the
//! `CSRFPreventionToken` header on writes).
//!
//! The lab's accounts: `root@pam` (password), its token `root@pam!lab` (not privilege
//! separated, so it holds root's privileges but is not root@pam), `root@pam!privsep`, a
//! privilege-separated token (Proxmox's default for a new token) holding only its own grants
//! (`pve::perms::PRIVSEP_GRANTS`), and `auditor@pve!ro`, a token with audit privileges only.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use hyper::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::error::{ApiError, ApiResult};
use crate::paths::Settings;
use crate::pve::perms::AuthUser;

/// Ticket lifetime, as on Proxmox.
const TICKET_LIFETIME: u64 = 2 * 3600;

/// The lab's credentials, kept in `secrets/secrets.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Secrets {
    /// root@pam's password.
    pub root_password: String,
    /// Secret of the `root@pam!lab` token.
    pub token_secret: String,
    /// Secret of the audit-only `auditor@pve!ro` token.
    pub audit_token_secret: String,
    /// Secret of the privilege-separated `root@pam!privsep` token (made on first use by
    /// a lab whose secrets predate it).
    #[serde(default)]
    pub privsep_token_secret: String,
    /// Key that signs tickets.
    pub ticket_key: String,
}

/// Random bytes as hex.
pub fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    let mut f = std::fs::File::open("/dev/urandom").expect("/dev/urandom exists");
    std::io::Read::read_exact(&mut f, &mut b).expect("/dev/urandom reads");
    hex::encode(b)
}

fn uuid() -> String {
    let h = random_hex(16);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

impl Secrets {
    fn path(lab: &Settings) -> std::path::PathBuf {
        lab.secrets_dir().join("secrets.json")
    }

    /// Reads the secrets.
    pub fn load(lab: &Settings) -> Result<Secrets> {
        let p = Self::path(lab);
        let raw =
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        serde_json::from_str(&raw).with_context(|| format!("parsing {}", p.display()))
    }

    /// Reads the secrets, making them on first use.
    pub fn load_or_create(lab: &Settings) -> Result<Secrets> {
        if Self::path(lab).exists() {
            let mut s = Self::load(lab)?;
            if s.privsep_token_secret.is_empty() {
                s.privsep_token_secret = uuid();
                s.save(lab)?;
            }
            return Ok(s);
        }
        let s = Secrets {
            root_password: random_hex(12),
            token_secret: uuid(),
            audit_token_secret: uuid(),
            privsep_token_secret: uuid(),
            ticket_key: random_hex(32),
        };
        s.save(lab)?;
        Ok(s)
    }

    fn save(&self, lab: &Settings) -> Result<()> {
        std::fs::create_dir_all(lab.secrets_dir())?;
        let p = Self::path(lab);
        let tmp = p.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(self)? + "\n")?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&tmp, &p)?;
        Ok(())
    }

    /// `PVE_TOKEN` for root's token.
    pub fn root_token(&self) -> String {
        format!("root@pam!lab={}", self.token_secret)
    }

    /// The privilege-separated token.
    pub fn privsep_token(&self) -> String {
        format!(
            "root@pam!{}={}",
            crate::pve::perms::PRIVSEP_TOKEN,
            self.privsep_token_secret
        )
    }

    /// The audit-only token.
    pub fn audit_token(&self) -> String {
        format!("auditor@pve!ro={}", self.audit_token_secret)
    }

    fn sign(&self, data: &str) -> String {
        hex::encode(Sha256::digest(format!("{}:{data}", self.ticket_key)))
    }

    fn csrf_token(&self, userid: &str, stamp: &str) -> String {
        format!(
            "{stamp}:{}",
            &self.sign(&format!("csrf:{userid}:{stamp}"))[..43]
        )
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `POST /access/ticket`.
pub fn login(
    secrets: &Secrets,
    username: Option<&str>,
    password: Option<&str>,
    realm: Option<&str>,
) -> ApiResult<Value> {
    let mut user = username.unwrap_or("").to_string();
    if !user.contains('@') {
        user = format!("{user}@{}", realm.unwrap_or("pam"));
    }
    if user != "root@pam" || password != Some(secrets.root_password.as_str()) {
        return Err(ApiError::unauthorized("authentication failure"));
    }
    let stamp = format!("{:08X}", now());
    let plain = format!("PVE:{user}:{stamp}");
    let ticket = format!("{plain}::{}", secrets.sign(&plain));
    Ok(json!({
        "username": user,
        "ticket": ticket,
        "CSRFPreventionToken": secrets.csrf_token(&user, &stamp),
        "cap": { "vms": {}, "storage": {}, "access": {}, "nodes": {}, "dc": {}, "sdn": {}, "mapping": {} },
    }))
}

fn cookie_ticket(headers: &HeaderMap) -> Option<String> {
    for h in headers.get_all("cookie") {
        for part in h.to_str().ok()?.split(';') {
            if let Some(t) = part.trim().strip_prefix("PVEAuthCookie=") {
                let decoded: String = form_urlencoded::parse(format!("t={t}").as_bytes())
                    .next()
                    .map(|(_, v)| v.into_owned())
                    .unwrap_or_default();
                return Some(decoded);
            }
        }
    }
    None
}

/// Authenticates a request; writes made with a ticket must carry the CSRF token.
pub fn authenticate(secrets: &Secrets, headers: &HeaderMap, is_write: bool) -> ApiResult<AuthUser> {
    if let Some(auth) = headers.get("authorization").and_then(|h| h.to_str().ok())
        && let Some(tok) = auth
            .strip_prefix("PVEAPIToken=")
            .or_else(|| auth.strip_prefix("PVEAPIToken "))
    {
        let Some((id, secret)) = tok.split_once('=') else {
            return Err(ApiError::unauthorized("invalid token value!"));
        };
        let Some((userid, name)) = id.split_once('!') else {
            return Err(ApiError::unauthorized("invalid token value!"));
        };
        let known = match (userid, name) {
            ("root@pam", "lab") => Some(&secrets.token_secret),
            ("auditor@pve", "ro") => Some(&secrets.audit_token_secret),
            ("root@pam", crate::pve::perms::PRIVSEP_TOKEN) => Some(&secrets.privsep_token_secret),
            _ => None,
        };
        return match known {
            Some(s) if s == secret => Ok(AuthUser {
                userid: userid.into(),
                token: Some(name.into()),
            }),
            Some(_) => Err(ApiError::unauthorized("invalid token value!")),
            None => Err(ApiError::unauthorized(&format!(
                "no such token '{name}' for user '{userid}'"
            ))),
        };
    }
    let Some(ticket) = cookie_ticket(headers) else {
        return Err(ApiError::unauthorized("No ticket"));
    };
    let user =
        verify_ticket(secrets, &ticket).ok_or_else(|| ApiError::unauthorized("invalid ticket"))?;
    if is_write {
        let csrf = headers
            .get("csrfpreventiontoken")
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        let stamp = csrf.split(':').next().unwrap_or("");
        let fresh = u64::from_str_radix(stamp, 16).is_ok_and(|t| now() < t + TICKET_LIFETIME);
        if !fresh || secrets.csrf_token(&user, stamp) != csrf {
            return Err(ApiError::unauthorized(
                "Permission denied - invalid csrf token",
            ));
        }
    }
    Ok(AuthUser {
        userid: user,
        token: None,
    })
}

fn verify_ticket(secrets: &Secrets, ticket: &str) -> Option<String> {
    let (plain, sig) = ticket.split_once("::")?;
    let mut parts = plain.split(':');
    let (Some("PVE"), Some(user), Some(stamp), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let t = u64::from_str_radix(stamp, 16).ok()?;
    (secrets.sign(plain) == sig && now() < t + TICKET_LIFETIME).then(|| user.to_string())
}
