//! The public keys a login with [`SshOptions`] would offer, in the order
//! `session::authenticate` tries them: the explicit identity file alone (its `.pub`), else
//! the ssh-agent's keys, then the key files (the config's `IdentityFile`s or OpenSSH's
//! defaults) that have a `.pub` beside them. A container provision creates or bootstraps
//! gets exactly these, so the login that follows is one the container accepts.

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::SshOptions;
use super::config::{self, default_identity_files, expand_tilde};
use super::known_hosts::{fingerprint, key_type};
use crate::transport::TransportError;

/// One public key provision logs in with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginKey {
    /// OpenSSH's one-line form, `TYPE BASE64 COMMENT`.
    pub line: String,
    /// `SHA256:…`.
    pub fingerprint: String,
    /// Where it comes from: `identity file ~/.ssh/k.pub`, `ssh-agent at ...`.
    pub from: String,
}

/// Every key a login with `opts` offers (empty: none at all). An explicit identity file
/// without its `.pub` is an error: its public half cannot be sent otherwise.
pub fn login_keys(opts: &SshOptions) -> Result<Vec<LoginKey>, TransportError> {
    if let Some(file) = &opts.identity_file {
        let file = expand_tilde(file);
        let public = pub_path(&file);
        return match read_pub(&public) {
            Some(k) => Ok(vec![k]),
            None => Err(TransportError::Config {
                target: opts.host.clone(),
                reason: format!(
                    "identity file {} has no readable public key {} beside it (make it with `ssh-keygen -y -f {} > {}`)",
                    file.display(),
                    public.display(),
                    file.display(),
                    public.display()
                ),
            }),
        };
    }
    let mut out = Vec::new();
    let agent = opts.agent_socket.clone().or_else(|| {
        std::env::var_os("SSH_AUTH_SOCK")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
    });
    if let Some(socket) = agent {
        out.extend(agent_keys(&socket));
    }
    let route = config::resolve(opts)?;
    let files = if route.target.identity_files.is_empty() {
        default_identity_files()
    } else {
        route.target.identity_files.clone()
    };
    for file in files {
        let file = expand_tilde(&file);
        if file.exists()
            && let Some(k) = read_pub(&pub_path(&file))
            && !out.iter().any(|o| o.fingerprint == k.fingerprint)
        {
            out.push(k);
        }
    }
    Ok(out)
}

fn pub_path(file: &Path) -> PathBuf {
    PathBuf::from(format!("{}.pub", file.display()))
}

/// A `.pub` file's key, when it holds one.
fn read_pub(path: &Path) -> Option<LoginKey> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text
        .lines()
        .find(|l| !l.trim().is_empty())?
        .trim()
        .to_string();
    let blob = STANDARD.decode(line.split_whitespace().nth(1)?).ok()?;
    key_type(&blob)?;
    Some(LoginKey {
        fingerprint: fingerprint(&blob),
        from: format!("identity file {}", path.display()),
        line,
    })
}

/// The agent's keys; none when it cannot be asked (the login would not use it either).
fn agent_keys(socket: &Path) -> Vec<LoginKey> {
    let Ok(session) = ssh2::Session::new() else {
        return Vec::new();
    };
    let Ok(mut agent) = session.agent() else {
        return Vec::new();
    };
    let listed = agent
        .set_identity_path(socket)
        .and_then(|()| agent.connect())
        .and_then(|()| agent.list_identities());
    let keys = match listed.and_then(|()| agent.identities()) {
        Ok(ids) => ids
            .iter()
            .filter_map(|id| {
                let blob = id.blob();
                let kind = key_type(blob)?;
                Some(LoginKey {
                    line: format!("{kind} {} {}", STANDARD.encode(blob), id.comment())
                        .trim_end()
                        .to_string(),
                    fingerprint: fingerprint(blob),
                    from: format!("ssh-agent at {}", socket.display()),
                })
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    let _ = agent.disconnect();
    keys
}
