//! Who may do what: `PVE::LXC::check_ct_modify_config_perm` and the three calls
//! `PUT .../config` makes of it (delete list, revert list, new values), with the privileges
//! a caller holds given by [`Privileges`]. Pinned by the oracle's answers in
//! `tests/fixtures/oracle/perm.jsonl`.

use std::collections::BTreeMap;

use crate::error::{ApiError, ApiResult};
use crate::options::{MountKind, indexed, is_mount_key};
use crate::propstr::{self, PropError};
use crate::version::Version;

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

/// The privileges a caller holds on a path (the ACL evaluation of `user.cfg`, which
/// `crates/pve` does not model: the caller says what is granted).
pub trait Privileges {
    /// Whether `privilege` is granted on `path`.
    fn has(&self, path: &str, privilege: &str) -> bool;
}

/// Privileges granted on path prefixes, propagated to sub-paths (`propagate=1` ACLs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants(pub Vec<(String, Vec<String>)>);

impl Privileges for Grants {
    fn has(&self, path: &str, privilege: &str) -> bool {
        self.0.iter().any(|(prefix, privs)| {
            (path == prefix || prefix == "/" || path.starts_with(&format!("{prefix}/")))
                && privs.iter().any(|p| p == privilege)
        })
    }
}

/// Every privilege everywhere (root@pam, or root's token without privilege separation).
#[derive(Debug, Clone, Copy, Default)]
pub struct AllPrivileges;

impl Privileges for AllPrivileges {
    fn has(&self, _: &str, _: &str) -> bool {
        true
    }
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

    /// `$rpcenv->check`: 403 `Permission check failed (path, priv)` unless granted, with
    /// the lab's users' privileges (see [`Privileges`] for `AuthUser`).
    pub fn check(&self, path: &str, privs: &[&str]) -> ApiResult<()> {
        need(self, path, privs)
    }
}

/// The lab's users: root@pam and root's tokens (not privilege-separated) hold everything;
/// the privilege-separated token holds its grants ([`PRIVSEP_GRANTS`]); any other user
/// (the lab's `auditor@pve`) holds audit privileges alone.
impl Privileges for AuthUser {
    fn has(&self, path: &str, privilege: &str) -> bool {
        self.privileges(path).contains(&privilege)
    }
}

/// `$rpcenv->check`: every privilege, or 403 naming the first one missing.
fn need(privs: &dyn Privileges, path: &str, wanted: &[&str]) -> ApiResult<()> {
    match wanted.iter().find(|p| !privs.has(path, p)) {
        Some(p) => Err(ApiError::perm(Some(&format!("{path}, {p}")))),
        None => Ok(()),
    }
}

fn perm_exc(what: &str) -> ApiError {
    ApiError::perm(Some(what))
}

/// A property string that does not parse, as the API reports the `die` (500).
fn format_die(e: PropError) -> ApiError {
    let mut err = ApiError::die(e.message);
    err.errors = e.errors;
    err
}

/// `$NEW_DISK_RE`: `STORAGE:SIZE`, the storage id as it stands.
fn new_disk_storage(volume: &str) -> Option<&str> {
    let (sid, size) = volume.split_once(':')?;
    let (int, frac) = size.split_once('.').unwrap_or((size, "0"));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (!sid.is_empty() && !sid.contains(char::is_whitespace) && digits(int) && digits(frac))
        .then_some(sid)
}

/// `PVE::Storage::check_volume_access` for an existing volume used as `rootdir`: the
/// storage's `Datastore.Allocate`, or the container's own volume, or (another guest's
/// disk) `Datastore.Audit` and that guest's `VM.Config.Disk`.
fn check_volume_access(privs: &dyn Privileges, vmid: u32, volid: &str) -> ApiResult<()> {
    let Some((sid, volname)) = volid.split_once(':') else {
        return Ok(());
    };
    if privs.has(&format!("/storage/{sid}"), "Datastore.Allocate") {
        return Ok(());
    }
    let owner = volname
        .rsplit('/')
        .next()
        .and_then(|n| {
            ["vm-", "subvol-", "base-", "basevol-"]
                .iter()
                .find_map(|p| n.strip_prefix(p))
        })
        .and_then(|rest| rest.split('-').next())
        .and_then(|id| id.parse::<u32>().ok());
    match owner {
        Some(o) if o == vmid => Ok(()),
        Some(o) => {
            need(privs, &format!("/storage/{sid}"), &["Datastore.Audit"])?;
            need(privs, &format!("/vms/{o}"), &["VM.Config.Disk"])
        }
        None => Err(ApiError::die(format!(
            "missing privileges to access {volid}"
        ))),
    }
}

/// `check_bridge_access`: `SDN.Use` on the bridge, or on each VLAN the value names.
fn check_bridge_access(privs: &dyn Privileges, raw: &str, version: Version) -> ApiResult<()> {
    let net = propstr::parse_for(&propstr::NET, raw, version).map_err(format_die)?;
    let Some(bridge) = net.get("bridge") else {
        return Ok(());
    };
    let zone = format!("/sdn/zones/localnetwork/{bridge}");
    let tag = net.get("tag").filter(|t| !t.is_empty() && *t != "0");
    if let Some(tag) = tag {
        need(privs, &format!("{zone}/{tag}"), &["SDN.Use"])?;
    }
    let trunks = net.get("trunks").filter(|t| !t.is_empty() && *t != "0");
    if let Some(trunks) = trunks {
        let mut tags: Vec<u32> = trunks.split(';').filter_map(|t| t.parse().ok()).collect();
        tags.sort_unstable();
        tags.dedup();
        for t in tags {
            need(privs, &format!("{zone}/{t}"), &["SDN.Use"])?;
        }
    }
    if tag.is_none() && trunks.is_none() {
        need(privs, &zone, &["SDN.Use"])?;
    }
    Ok(())
}

/// One question to `check_ct_modify_config_perm`.
#[derive(Debug, Clone, Copy)]
pub struct Modify<'a> {
    /// The container.
    pub vmid: u32,
    /// The config as it is (absent for a create).
    pub oldconf: Option<&'a BTreeMap<String, String>>,
    /// Whether the container is unprivileged.
    pub unprivileged: bool,
    /// Whose rules.
    pub version: Version,
}

impl Modify<'_> {
    fn old(&self, key: &str) -> Option<&str> {
        self.oldconf.and_then(|c| c.get(key)).map(String::as_str)
    }

    /// One option, set (`is_delete` false) or deleted.
    fn check_opt(
        &self,
        user: &AuthUser,
        privs: &dyn Privileges,
        newconf: &BTreeMap<String, String>,
        opt: &str,
        is_delete: bool,
    ) -> ApiResult<()> {
        let vm = format!("/vms/{}", self.vmid);
        let vm_perm = || need(privs, &vm, &[config_privilege(opt)]);
        if ["cores", "cpuunits", "cpulimit"].contains(&opt) {
            vm_perm()
        } else if is_mount_key(opt) {
            vm_perm()?;
            if is_delete {
                return Ok(());
            }
            let fmt = propstr::format_of(opt).unwrap_or(propstr::MP);
            let value = newconf.get(opt).map(String::as_str).unwrap_or("");
            let mp = propstr::parse_for(&fmt, value, self.version).map_err(format_die)?;
            let volume = mp.get("volume").map(String::as_str).unwrap_or("");
            let kind = MountKind::of(volume);
            if kind != MountKind::Volume {
                return Err(perm_exc(&format!(
                    "mount point type {} is only allowed for root@pam",
                    kind.name()
                )));
            }
            match new_disk_storage(volume) {
                Some(sid) => need(
                    privs,
                    &format!("/storage/{sid}"),
                    &["Datastore.AllocateSpace"],
                ),
                None => check_volume_access(privs, self.vmid, volume),
            }
        } else if opt == "memory" || opt == "swap" {
            vm_perm()
        } else if indexed(opt, "net") {
            vm_perm()?;
            if !user.is_root_pam() {
                if let Some(old) = self.old(opt).filter(|v| !v.is_empty()) {
                    check_bridge_access(privs, old, self.version)?;
                }
                if let Some(new) = newconf.get(opt).filter(|v| !v.is_empty() && *v != "0") {
                    check_bridge_access(privs, new, self.version)?;
                }
            }
            Ok(())
        } else if indexed(opt, "dev") {
            Err(perm_exc(
                "configuring device passthrough is only allowed for root@pam",
            ))
        } else if ["nameserver", "searchdomain", "hostname"].contains(&opt) {
            vm_perm()
        } else if opt == "features" {
            self.check_features(privs, newconf, is_delete, &vm)
        } else if opt == "hookscript" {
            Err(perm_exc(
                "changing the hookscript is only allowed for root@pam",
            ))
        } else {
            // `tags` too: with datacenter.cfg's default (`user-tag-access: free`, no
            // privileged tags) `assert_tag_permissions` asks for this alone.
            vm_perm()
        }
    }

    /// Feature flags compared as Proxmox parses them: only `nesting` may change without
    /// root@pam, and only on an unprivileged container.
    fn check_features(
        &self,
        privs: &dyn Privileges,
        newconf: &BTreeMap<String, String>,
        is_delete: bool,
        vm: &str,
    ) -> ApiResult<()> {
        if !self.unprivileged {
            return Err(perm_exc(
                "changing feature flags for privileged container is only allowed for root@pam",
            ));
        }
        let parse = |s: Option<&str>| -> ApiResult<BTreeMap<String, String>> {
            match s.filter(|s| !s.is_empty() && *s != "0") {
                Some(s) => {
                    propstr::parse_for(&propstr::FEATURES, s, self.version).map_err(format_die)
                }
                None => Ok(BTreeMap::new()),
            }
        };
        let only_nesting = |f: &BTreeMap<String, String>| f.len() == 1 && f.contains_key("nesting");
        let (mut nesting_changed, mut other_changed) = (false, false);
        if !is_delete {
            let features = parse(newconf.get("features").map(String::as_str))?;
            if let Some(old) = self.old("features").filter(|s| !s.is_empty() && *s != "0") {
                let old = parse(Some(old))?;
                for k in old.keys().chain(features.keys()) {
                    if old.get(k) != features.get(k) {
                        if k == "nesting" {
                            nesting_changed = true;
                        } else {
                            other_changed = true;
                            break;
                        }
                    }
                }
            } else if only_nesting(&features) {
                nesting_changed = true;
            } else if !features.is_empty() {
                other_changed = true;
            }
        } else {
            let old = parse(self.old("features"))?;
            if only_nesting(&old) {
                nesting_changed = true;
            } else if !old.is_empty() {
                other_changed = true;
            }
        }
        if other_changed {
            return Err(perm_exc(
                "changing feature flags (except nesting) is only allowed for root@pam",
            ));
        }
        if nesting_changed {
            need(privs, vm, &["VM.Allocate"])?;
        }
        Ok(())
    }

    /// `check_ct_modify_config_perm(..., $newconf, $delete, ...)`: the new values, then
    /// the deleted keys. (Proxmox walks `$newconf` in hash order: where two values are
    /// refused, which one it names is not fixed; here it is the first by key.)
    pub fn check(
        &self,
        user: &AuthUser,
        privs: &dyn Privileges,
        newconf: &BTreeMap<String, String>,
        delete: &[String],
    ) -> ApiResult<()> {
        if user.is_root_pam() {
            return Ok(());
        }
        for opt in newconf.keys() {
            self.check_opt(user, privs, newconf, opt, false)?;
        }
        for opt in delete {
            self.check_opt(user, privs, newconf, opt, true)?;
        }
        Ok(())
    }

    /// What `PUT .../config` asks, in its order: the delete list, the revert list (as
    /// deletions), then the new values.
    pub fn check_update(
        &self,
        user: &AuthUser,
        privs: &dyn Privileges,
        set: &BTreeMap<String, String>,
        delete: &[String],
        revert: &[String],
    ) -> ApiResult<()> {
        let none = BTreeMap::new();
        self.check(user, privs, &none, delete)?;
        self.check(user, privs, &none, revert)?;
        self.check(user, privs, set, &[])
    }
}

/// Checks the privileges needed to set `newconf` and delete `delete` on a container, with
/// the lab's users' privileges and PVE 9's rules (one call of `check_ct_modify_config_perm`).
pub fn check_modify(
    user: &AuthUser,
    vmid: u32,
    oldconf: Option<&BTreeMap<String, String>>,
    newconf: &BTreeMap<String, String>,
    delete: &[String],
    unprivileged: bool,
) -> ApiResult<()> {
    Modify {
        vmid,
        oldconf,
        unprivileged,
        version: Version::Pve9,
    }
    .check(user, user, newconf, delete)
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

    #[test]
    fn an_unparsable_mount_point_is_no_volume() {
        // `idmap` is PVE 9's: on PVE 8 the value does not parse, and is refused as such,
        // never taken for a storage volume.
        let idmap = BTreeMap::from([(
            "mp0".to_string(),
            "/tank/shared,mp=/shared,idmap=u:0:1000:1".to_string(),
        )]);
        let ask = |version| {
            Modify {
                vmid: 100,
                oldconf: None,
                unprivileged: true,
                version,
            }
            .check(&token(), &AllPrivileges, &idmap, &[])
            .unwrap_err()
        };
        assert_eq!(ask(Version::Pve9).status, 403);
        assert_eq!(ask(Version::Pve8).status, 500);
    }
}
