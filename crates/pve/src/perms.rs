//! Who may do what: the lab's users and the root@pam-only rules of
//! `PVE::LXC::check_ct_modify_config_perm`.

use std::collections::BTreeMap;

use crate::error::{ApiError, ApiResult};
use crate::options::{MountKind, indexed, is_mount_key};
use crate::propstr;

/// The name of the lab's privilege-separated token (`root@pam!privsep`), Proxmox's default
/// for a new token: it holds only what ACLs grant the token itself ([`PRIVSEP_GRANTS`]),
/// never its user's privileges.
pub const PRIVSEP_TOKEN: &str = "privsep";

/// What the privilege-separated token is granted, by path (propagating): PVEVMAdmin on
/// `/vms` and PVEDatastoreUser on `/storage`, as an operator grants a deployment token,
/// without `Sys.Modify` on `/` (which a privileged container's create needs).
pub const PRIVSEP_GRANTS: &[(&str, &[&str])] = &[
    (
        "/vms",
        &[
            "VM.Allocate",
            "VM.Audit",
            "VM.Config.CPU",
            "VM.Config.Disk",
            "VM.Config.Memory",
            "VM.Config.Network",
            "VM.Config.Options",
            "VM.Console",
            "VM.PowerMgmt",
        ],
    ),
    ("/storage", &["Datastore.AllocateSpace", "Datastore.Audit"]),
];

/// Every privilege of Proxmox VE 9 (pve-access-control's `$privgroups`): what root holds.
pub const ALL_PRIVILEGES: &[&str] = &[
    "Datastore.Allocate",
    "Datastore.AllocateSpace",
    "Datastore.AllocateTemplate",
    "Datastore.Audit",
    "Group.Allocate",
    "Mapping.Audit",
    "Mapping.Modify",
    "Mapping.Use",
    "Pool.Allocate",
    "Pool.Audit",
    "Realm.Allocate",
    "Realm.AllocateUser",
    "SDN.Allocate",
    "SDN.Audit",
    "SDN.Use",
    "Sys.AccessNetwork",
    "Sys.Audit",
    "Sys.Console",
    "Sys.Incoming",
    "Sys.Modify",
    "Sys.PowerMgmt",
    "Sys.Syslog",
    "User.Modify",
    "VM.Allocate",
    "VM.Audit",
    "VM.Backup",
    "VM.Clone",
    "VM.Config.CDROM",
    "VM.Config.CPU",
    "VM.Config.Cloudinit",
    "VM.Config.Disk",
    "VM.Config.HWType",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.Options",
    "VM.Console",
    "VM.GuestAgent.Audit",
    "VM.GuestAgent.FileRead",
    "VM.GuestAgent.FileSystemMgmt",
    "VM.GuestAgent.FileWrite",
    "VM.GuestAgent.Unrestricted",
    "VM.Migrate",
    "VM.PowerMgmt",
    "VM.Replicate",
    "VM.Snapshot",
    "VM.Snapshot.Rollback",
];

/// The privilege on `/vms/{vmid}` that setting container option `opt` needs, by
/// `check_ct_modify_config_perm` (mount points, `devN`, features and the hookscript have
/// further root@pam-only rules, see [`check_modify`]).
pub fn config_privilege(opt: &str) -> &'static str {
    if ["cores", "cpuunits", "cpulimit"].contains(&opt) {
        "VM.Config.CPU"
    } else if is_mount_key(opt) {
        "VM.Config.Disk"
    } else if opt == "memory" || opt == "swap" {
        "VM.Config.Memory"
    } else if indexed(opt, "net") || ["nameserver", "searchdomain", "hostname"].contains(&opt) {
        "VM.Config.Network"
    } else if opt == "features" {
        "VM.Allocate"
    } else {
        "VM.Config.Options"
    }
}

/// The authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthUser {
    /// `user@realm`.
    pub userid: String,
    /// API token name, when authenticated by token.
    pub token: Option<String>,
}

impl AuthUser {
    /// root@pam logged in with a ticket (or `pct` on the node).
    pub fn root() -> AuthUser {
        AuthUser {
            userid: "root@pam".into(),
            token: None,
        }
    }

    /// `user@realm` or `user@realm!token`, as in UPIDs and permission checks.
    pub fn authid(&self) -> String {
        match &self.token {
            Some(t) => format!("{}!{t}", self.userid),
            None => self.userid.clone(),
        }
    }

    /// True only for root@pam itself; a token of root is not root@pam.
    pub fn is_root_pam(&self) -> bool {
        self.token.is_none() && self.userid == "root@pam"
    }

    /// Whether the caller has every privilege (root@pam and root's tokens, unseparated).
    fn is_superuser(&self) -> bool {
        self.userid == "root@pam" && self.token.as_deref() != Some(PRIVSEP_TOKEN)
    }

    /// The privileges the caller holds on `path` (`$rpcenv->permissions`): all for root,
    /// the grants of its paths for the privilege-separated token, audit ones for the
    /// auditor.
    pub fn privileges(&self, path: &str) -> Vec<&'static str> {
        if self.is_superuser() {
            return ALL_PRIVILEGES.to_vec();
        }
        if self.token.as_deref() == Some(PRIVSEP_TOKEN) {
            return PRIVSEP_GRANTS
                .iter()
                .filter(|(g, _)| path == *g || path.starts_with(&format!("{g}/")))
                .flat_map(|(_, p)| p.iter().copied())
                .collect();
        }
        ALL_PRIVILEGES
            .iter()
            .copied()
            .filter(|p| p.ends_with(".Audit"))
            .collect()
    }

    /// `$rpcenv->check`: 403 `Permission check failed (path, priv)` unless granted.
    pub fn check(&self, path: &str, privs: &[&str]) -> ApiResult<()> {
        let held = self.privileges(path);
        if privs.iter().all(|p| held.contains(p)) {
            return Ok(());
        }
        Err(ApiError::perm(Some(&format!(
            "{path}, {}",
            privs.join("|")
        ))))
    }
}

fn perm_exc(what: &str) -> ApiError {
    ApiError::perm(Some(what))
}

/// Checks the privileges needed to set `newconf` and delete `delete` on a container.
pub fn check_modify(
    user: &AuthUser,
    vmid: u32,
    oldconf: Option<&BTreeMap<String, String>>,
    newconf: &BTreeMap<String, String>,
    delete: &[String],
    unprivileged: bool,
) -> ApiResult<()> {
    if user.is_root_pam() {
        return Ok(());
    }
    let vm = format!("/vms/{vmid}");
    let old = |k: &str| oldconf.and_then(|c| c.get(k)).map(String::as_str);
    let check = |opt: &str, is_delete: bool| -> ApiResult<()> {
        if is_mount_key(opt) {
            user.check(&vm, &[config_privilege(opt)])?;
            if is_delete {
                return Ok(());
            }
            let value = newconf.get(opt).map(String::as_str).unwrap_or("");
            let fmt = propstr::format_of(opt).expect("mount keys have a format");
            let volume = propstr::parse(&fmt, value)
                .ok()
                .and_then(|m| m.get("volume").cloned());
            let kind = MountKind::of(volume.as_deref().unwrap_or(""));
            if kind != MountKind::Volume {
                return Err(perm_exc(&format!(
                    "mount point type {} is only allowed for root@pam",
                    kind.name()
                )));
            }
            Ok(())
        } else if indexed(opt, "dev") {
            Err(perm_exc(
                "configuring device passthrough is only allowed for root@pam",
            ))
        } else if opt == "features" {
            if !unprivileged {
                return Err(perm_exc(
                    "changing feature flags for privileged container is only allowed for root@pam",
                ));
            }
            let parse = |s: Option<&str>| {
                s.and_then(|s| propstr::parse(&propstr::FEATURES, s).ok())
                    .unwrap_or_default()
            };
            let before = parse(old("features"));
            let after = if is_delete {
                BTreeMap::new()
            } else {
                parse(newconf.get(opt).map(String::as_str))
            };
            let other_changed = before
                .keys()
                .chain(after.keys())
                .any(|k| k != "nesting" && before.get(k) != after.get(k));
            if other_changed {
                return Err(perm_exc(
                    "changing feature flags (except nesting) is only allowed for root@pam",
                ));
            }
            user.check(&vm, &[config_privilege(opt)])
        } else if opt == "hookscript" {
            Err(perm_exc(
                "changing the hookscript is only allowed for root@pam",
            ))
        } else {
            user.check(&vm, &[config_privilege(opt)])
        }
    };
    for opt in newconf.keys() {
        check(opt, false)?;
    }
    for opt in delete {
        check(opt, true)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> AuthUser {
        AuthUser {
            userid: "root@pam".into(),
            token: Some("lab".into()),
        }
    }

    #[test]
    fn root_token_is_not_root_pam() {
        let conf = BTreeMap::from([("mp0".to_string(), "/srv,mp=/shared".to_string())]);
        let err = check_modify(&token(), 100, None, &conf, &[], true).unwrap_err();
        assert_eq!(err.status, 403);
        assert_eq!(
            err.message,
            "Permission check failed (mount point type bind is only allowed for root@pam)"
        );
        assert!(check_modify(&AuthUser::root(), 100, None, &conf, &[], true).is_ok());
    }

    #[test]
    fn the_privilege_separated_token_holds_its_grants_only() {
        let t = AuthUser {
            userid: "root@pam".into(),
            token: Some(PRIVSEP_TOKEN.into()),
        };
        assert!(t.check("/vms/129", &["VM.Allocate"]).is_ok());
        assert!(
            t.check("/storage/local", &["Datastore.AllocateSpace"])
                .is_ok()
        );
        let e = t.check("/", &["Sys.Modify"]).unwrap_err();
        assert_eq!(
            (e.status, e.message.as_str()),
            (403, "Permission check failed (/, Sys.Modify)")
        );
        assert!(t.privileges("/").is_empty());
        assert!(token().check("/", &["Sys.Modify"]).is_ok());
    }

    #[test]
    fn nesting_alone_is_allowed_for_tokens() {
        let nest = BTreeMap::from([("features".to_string(), "nesting=1".to_string())]);
        assert!(check_modify(&token(), 100, None, &nest, &[], true).is_ok());
        let keyctl = BTreeMap::from([("features".to_string(), "keyctl=1,nesting=1".to_string())]);
        assert_eq!(
            check_modify(&token(), 100, None, &keyctl, &[], true)
                .unwrap_err()
                .status,
            403
        );
        assert_eq!(
            check_modify(&token(), 100, None, &nest, &[], false)
                .unwrap_err()
                .status,
            403
        );
    }
}
