//! Where to connect: the target and its jump hosts, resolved from [`SshOptions`] and the
//! user's `~/.ssh/config` (Host, HostName, User, Port, IdentityFile, ProxyJump), options
//! given explicitly winning over the file, as on OpenSSH's command line.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use ssh2_config::{ParseRule, SshConfig};

use super::SshOptions;
use crate::transport::TransportError;

/// One SSH server on the way: the jump hosts, then the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hop {
    /// The address to connect to (HostName when the config gives one); also the name
    /// looked up in `known_hosts`, as OpenSSH does.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Login user.
    pub user: String,
    /// IdentityFile lines that apply to this host, in order.
    pub identity_files: Vec<PathBuf>,
}

impl Hop {
    /// `user@host:port`, for messages.
    pub fn describe(&self) -> String {
        if self.host.contains(':') {
            format!("{}@[{}]:{}", self.user, self.host, self.port)
        } else {
            format!("{}@{}:{}", self.user, self.host, self.port)
        }
    }

    /// `host:port`, for host key messages.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// The jump hosts in the order they are passed through, then the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Route {
    /// Jump hosts, first connected first.
    pub jumps: Vec<Hop>,
    /// The host commands run on.
    pub target: Hop,
}

/// Resolves `opts` against the ssh config file it names (or `~/.ssh/config` when that
/// exists).
pub(crate) fn resolve(opts: &SshOptions) -> Result<Route, TransportError> {
    let config = load(opts)?;
    let params = config.query(&opts.host);
    let target = Hop {
        host: host_name(params.host_name.as_deref(), &opts.host),
        port: opts.port.or(params.port).unwrap_or(22),
        user: opts
            .user
            .clone()
            .or(params.user.clone())
            .unwrap_or_else(default_user),
        identity_files: params.identity_file.clone().unwrap_or_default(),
    };
    let jump_specs: Vec<String> = match &opts.proxy_jump {
        Some(spec) => split_jumps(spec),
        None => params.proxy_jump.clone().unwrap_or_default(),
    };
    let mut jumps = Vec::new();
    for spec in jump_specs {
        if spec.eq_ignore_ascii_case("none") {
            jumps.clear();
            break;
        }
        let (user, alias, port) = parse_jump(&spec).map_err(|reason| TransportError::Config {
            target: opts.host.clone(),
            reason: format!("ProxyJump `{spec}`: {reason}"),
        })?;
        let p = config.query(&alias);
        jumps.push(Hop {
            host: host_name(p.host_name.as_deref(), &alias),
            port: port.or(p.port).unwrap_or(22),
            user: user.or(p.user).unwrap_or_else(default_user),
            identity_files: p.identity_file.unwrap_or_default(),
        });
    }
    Ok(Route { jumps, target })
}

/// The parsed config: the file `opts` names, else `~/.ssh/config` when it exists, else
/// nothing.
fn load(opts: &SshOptions) -> Result<SshConfig, TransportError> {
    let path = match &opts.ssh_config {
        Some(path) => path.clone(),
        None => match home().map(|h| h.join(".ssh/config")) {
            Some(p) if p.exists() => p,
            _ => return Ok(SshConfig::default()),
        },
    };
    let fail = |reason: String| TransportError::Config {
        target: opts.host.clone(),
        reason: format!("{}: {reason}", path.display()),
    };
    let file = File::open(&path).map_err(|e| fail(e.to_string()))?;
    let mut config = SshConfig::default();
    if let Some(home) = home() {
        config = config.home_dir(home);
    }
    // Real configs carry many options we do not use (ControlMaster, ForwardAgent ...):
    // they are allowed and ignored, not errors.
    config
        .parse(
            &mut BufReader::new(file),
            ParseRule::ALLOW_UNKNOWN_FIELDS | ParseRule::ALLOW_UNSUPPORTED_FIELDS,
        )
        .map_err(|e| fail(e.to_string()))
}

/// `HostName` with OpenSSH's `%h` (the name given) expanded, else the name given.
fn host_name(configured: Option<&str>, alias: &str) -> String {
    match configured {
        Some(name) => name.replace("%h", alias),
        None => alias.to_string(),
    }
}

/// The user's home directory, from `HOME`.
pub(crate) fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// The login user when neither the options nor the config name one: the local user, as
/// OpenSSH does.
fn default_user() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "root".to_string())
}

/// The private keys OpenSSH tries when the config names none.
pub(crate) fn default_identity_files() -> Vec<PathBuf> {
    let Some(home) = home() else {
        return Vec::new();
    };
    ["id_ed25519", "id_ecdsa", "id_rsa"]
        .iter()
        .map(|name| home.join(".ssh").join(name))
        .collect()
}

/// Splits a ProxyJump value (`a,b`) into its hops.
fn split_jumps(spec: &str) -> Vec<String> {
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// Parses one ProxyJump hop: `[user@]host[:port]`, `[user@][v6addr]:port` or
/// `ssh://[user@]host[:port]`.
fn parse_jump(spec: &str) -> Result<(Option<String>, String, Option<u16>), BadJump> {
    let rest = spec.strip_prefix("ssh://").unwrap_or(spec);
    let (user, rest) = match rest.rsplit_once('@') {
        Some((u, r)) if !u.is_empty() => (Some(u.to_string()), r),
        Some(_) => return Err(BadJump("empty user name".into())),
        None => (None, rest),
    };
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| BadJump("unclosed `[`".into()))?;
        match after.strip_prefix(':') {
            Some(p) => (host, Some(p)),
            None if after.is_empty() => (host, None),
            None => return Err(BadJump(format!("unexpected `{after}` after `]`"))),
        }
    } else {
        match rest.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (rest, None),
        }
    };
    if host.is_empty() {
        return Err(BadJump("no host name".into()));
    }
    let port = port
        .map(|p| {
            p.parse::<u16>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| BadJump(format!("`{p}` is not a port number")))
        })
        .transpose()?;
    Ok((user, host.to_string(), port))
}

/// Why a ProxyJump hop cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct BadJump(String);

/// Expands a leading `~/` against the home directory, for paths given in options.
pub(crate) fn expand_tilde(path: &Path) -> PathBuf {
    match (path.strip_prefix("~"), home()) {
        (Ok(rest), Some(home)) => home.join(rest),
        _ => path.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jump_specs_parse() {
        assert_eq!(
            parse_jump("root@10.0.0.2:2222").unwrap(),
            (Some("root".into()), "10.0.0.2".into(), Some(2222))
        );
        assert_eq!(parse_jump("node").unwrap(), (None, "node".into(), None));
        assert_eq!(
            parse_jump("ssh://a@[::1]:22").unwrap(),
            (Some("a".into()), "::1".into(), Some(22))
        );
        assert!(parse_jump("h:notaport").is_err());
        assert!(parse_jump("@h").is_err());
        assert_eq!(split_jumps("a, b:2"), vec!["a", "b:2"]);
    }

    #[test]
    fn explicit_options_win_over_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("config");
        std::fs::write(
            &cfg,
            "Host guest\n  HostName 10.0.0.5\n  User svc\n  Port 2200\n  IdentityFile /k/guest\n  ProxyJump jumper\n  ControlMaster auto\n\
             Host jumper\n  HostName 10.0.0.1\n  User admin\n  IdentityFile /k/jump\n\
             Host *\n  IdentityFile /k/all\n",
        )
        .unwrap();
        let mut opts = SshOptions::new("guest");
        opts.ssh_config = Some(cfg.clone());
        let route = resolve(&opts).unwrap();
        assert_eq!(route.target.host, "10.0.0.5");
        assert_eq!(route.target.user, "svc");
        assert_eq!(route.target.port, 2200);
        assert_eq!(
            route.target.identity_files,
            vec![PathBuf::from("/k/guest"), PathBuf::from("/k/all")]
        );
        assert_eq!(route.jumps.len(), 1);
        assert_eq!(route.jumps[0].describe(), "admin@10.0.0.1:22");

        opts.user = Some("root".into());
        opts.port = Some(22);
        opts.proxy_jump = Some("none".into());
        let route = resolve(&opts).unwrap();
        assert_eq!(route.target.describe(), "root@10.0.0.5:22");
        assert!(route.jumps.is_empty());
    }

    #[test]
    fn a_missing_named_config_is_an_error() {
        let mut opts = SshOptions::new("h");
        opts.ssh_config = Some(PathBuf::from("/nonexistent/ssh_config"));
        let err = resolve(&opts).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/ssh_config"), "{err}");
    }
}
