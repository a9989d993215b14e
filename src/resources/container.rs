//! A container's Proxmox configuration, as the node's API reads and writes it.

use super::op::{Allowed, ApiOp, Op};
use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use pve::normalize::same;

use super::pve_lines::PveLinesSpec;
use super::wire::{Facts, NotRead, Probe};
use super::{Delta, Resource, StepsError};
pub use crate::inventory::container::RestartPolicy;
use crate::plan::{Action, Attribute, Change};

/// Keys Proxmox only takes when a container is created: a change replaces the container.
/// (`rootfs` is create-only in its storage; its size can only grow, in place.)
const CREATE_ONLY: &[&str] = &["ostemplate", "unprivileged"];

/// The label of the node-step lines split from a container's config for a token node.
pub const ROOT_ONLY_LABEL: &str = "root-only";

/// Options a running container takes at once (`update_pct_config`'s hotplug set); anything
/// else waits in `[pve:pending]` until the container restarts.
fn applies_live(key: &str) -> bool {
    const LIVE: &[&str] = &[
        "description",
        "onboot",
        "startup",
        "protection",
        "hostname",
        "hookscript",
        "cores",
        "tags",
        "memory",
        "swap",
        "cpulimit",
        "cpuunits",
    ];
    LIVE.contains(&key) || pve::options::indexed(key, "net")
}

/// The first line of the description of a container provision created; the next line
/// records its template (Proxmox keeps no `ostemplate`), so a template change is seen.
pub const MARKER: &str = "Managed by provision.";

/// The description written at creation: the marker, the template, and the vmid it was
/// created at, when, and by which inventory (`provision: created=<vmid> at <utc> by
/// <inventory file>`). A copy of the container (`pct clone`, a restore to another vmid)
/// carries the description along, so only a marker naming the container's own vmid says
/// provision created it; another inventory's containers on the same node are not this
/// one's to name.
pub fn marker_description(template: &str, vmid: u64, at: &str, owner: &str) -> String {
    format!(
        "{MARKER}\nprovision: template={template}\nprovision: created={vmid} at {at} by {owner}\n"
    )
}

/// The time a container is created at, as its marker records it (UTC).
pub fn now() -> String {
    crate::machine::utc_now()
}

/// When the inventory `owner` created the container `found` at `vmid`, from its marker:
/// `None` for a container provision did not create, a copy made at another vmid, one of
/// another inventory, or one created before the marker named its vmid (none of them is
/// ever named or destroyed for being undeclared).
pub fn marker_created(found: &PveContainerFact, vmid: u64, owner: &str) -> Option<String> {
    let d = found.current("description")?;
    if !d.starts_with(MARKER) || owner.is_empty() {
        return None;
    }
    let rest = d
        .lines()
        .find_map(|l| l.strip_prefix("provision: created="))?;
    let (id, rest) = rest.split_once(" at ")?;
    let (at, by) = rest.split_once(" by ")?;
    (id.trim().parse::<u64>().ok()? == vmid && by.trim() == owner).then(|| at.trim().to_string())
}

/// The template recorded by [`marker_description`], when provision created the container.
pub fn marker_template(fact: &PveContainerFact) -> Option<&str> {
    let d = fact.current("description")?;
    if !d.starts_with(MARKER) {
        return None;
    }
    d.lines()
        .find_map(|l| l.strip_prefix("provision: template="))
        .map(str::trim)
}

/// A container's desired Proxmox configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerSpec {
    /// vmid.
    pub vmid: u64,
    /// The node's name in Proxmox.
    pub pve_node: String,
    /// Config keys and values, as the API takes them on create.
    pub config: Vec<(String, String)>,
    /// Public keys for root's `authorized_keys`, set at creation.
    pub ssh_public_keys: Vec<String>,
    /// Whether apply may restart it to apply pending changes.
    #[serde(default)]
    pub restart: RestartPolicy,
    /// Whether its node has SSH, so a created container is bootstrapped through the node
    /// (`pct exec`/`pct push`) before SSH takes over.
    #[serde(default)]
    pub bootstrap: bool,
    /// Keys written as node steps over node SSH (root-only keys a token may not write, see
    /// [`ContainerSpec::split_root_only`]): not in `config`, and not removed as unlisted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_keys: Vec<String>,
    /// Which of `ssh_public_keys` provision itself logs in with, and where each came from
    /// (`SHA256:… from ssh-agent at …`), for the plan.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub login_keys: Vec<String>,
}

impl ContainerSpec {
    /// Adds the keys provision logs in with (`(line, description)`) to those set at
    /// creation, each once (compared by key, not comment).
    pub fn add_login_keys(&mut self, keys: impl IntoIterator<Item = (String, String)>) {
        let blob = |l: &str| l.split_whitespace().nth(1).map(str::to_string);
        for (line, about) in keys {
            if !self.ssh_public_keys.iter().any(|k| blob(k) == blob(&line)) {
                self.ssh_public_keys.push(line);
            }
            self.login_keys.push(about);
        }
    }

    /// The wanted keys an API token (even root's) may not write, by Proxmox's own rules
    /// (`pve::perms`): bind mounts, device passthrough, features other than nesting.
    /// Create-only keys are never among them (they go with the create).
    pub fn root_only_keys(&self) -> Vec<String> {
        let token = pve::perms::AuthUser {
            userid: "root@pam".into(),
            token: Some("provision".into()),
        };
        let unprivileged = self.get("unprivileged") != Some("0");
        self.config
            .iter()
            .filter(|(k, _)| !CREATE_ONLY.contains(&k.as_str()))
            .filter(|(k, v)| {
                let one = BTreeMap::from([(k.clone(), v.clone())]);
                pve::perms::check_modify(&token, self.vmid as u32, None, &one, &[], unprivileged)
                    .is_err()
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// For a node reached with a token and with node SSH: takes the root-only keys out of
    /// the API's config and returns them as node-step lines (`pct set` over node SSH as
    /// root), or `None` when there are none.
    pub fn split_root_only(&mut self) -> Option<PveLinesSpec> {
        let keys = self.root_only_keys();
        if keys.is_empty() {
            return None;
        }
        let lines = self
            .config
            .iter()
            .filter(|(k, _)| keys.contains(k))
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        self.config.retain(|(k, _)| !keys.contains(k));
        self.node_keys = keys;
        Some(PveLinesSpec {
            vmid: self.vmid,
            label: ROOT_ONLY_LABEL.into(),
            lines,
            owner: None,
            retire: Vec::new(),
        })
    }

    /// A wanted option's value.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.config
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The create-only keys whose wanted value differs from `found`: each forces a replace.
    fn create_only_changes(&self, found: &PveContainerFact) -> Vec<Attribute> {
        let mut out = Vec::new();
        if let (Some(want), Some(have)) = (self.get("ostemplate"), marker_template(found))
            && want != have
        {
            out.push(Attribute::change(
                "ostemplate",
                Some(have.to_string()),
                Some(want.to_string()),
            ));
        }
        if let Some(want) = self.get("unprivileged") {
            let have = found.current("unprivileged").unwrap_or("0");
            if !same("unprivileged", want, Some(have)) {
                out.push(Attribute::change(
                    "unprivileged",
                    Some(have.to_string()),
                    Some(want.to_string()),
                ));
            }
        }
        let storage = |v: &str| v.split([':', ',']).next().unwrap_or("").to_string();
        if let (Some(want), Some(have)) = (self.get("rootfs"), found.current("rootfs"))
            && storage(want) != storage(have)
        {
            out.push(Attribute::change(
                "rootfs storage",
                Some(storage(have)),
                Some(storage(want)),
            ));
        }
        out
    }

    /// Keys of option families the inventory owns wholly (`netN`, `mpN`): ones it does not
    /// list are removed.
    fn owned_extra<'a>(&self, found: &'a PveContainerFact) -> Vec<(&'a str, &'a str)> {
        found
            .config
            .iter()
            .filter(|(k, _)| {
                (pve::options::indexed(k, "net") || pve::options::indexed(k, "mp"))
                    && self.get(k).is_none()
                    && !self.node_keys.contains(k)
                    && !found.pending_delete.contains(k)
            })
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    /// The in-place delta against `found`, or a replace when a create-only key changed.
    pub fn update_delta(&self, found: &PveContainerFact) -> Option<Delta> {
        let replace = self.create_only_changes(found);
        if !replace.is_empty() {
            let mut d = Delta::new(Action::Replace).reason(
                "a create-only setting changed: apply destroys and recreates the container only with --allow-replace (host bind-mounted data is kept, the container's own volumes are not)",
            );
            d.attributes = replace;
            return Some(d);
        }
        let mut d = Delta::new(Action::Update);
        let (mut live, mut later, mut queued) = (Vec::new(), Vec::new(), Vec::new());
        // The config keys the API writes (a value, or a delete), apart from the start and
        // the reboot: what apply acts on, not the attributes' labels.
        let (mut set, mut reboot) = (Vec::new(), false);
        for (k, want) in &self.config {
            if CREATE_ONLY.contains(&k.as_str()) {
                continue;
            }
            let have = found.current(k);
            let pending = found.pending.get(k).map(String::as_str);
            let deleting = found.pending_delete.contains(k);
            if same(k, want, have) && pending.is_none_or(|p| same(k, want, Some(p))) && !deleting {
                continue;
            }
            if pending.is_some_and(|p| same(k, want, Some(p))) {
                queued.push(k.clone());
                continue;
            }
            if k == "rootfs" {
                d = d.reason(
                    "the root filesystem's size differs: growing it (`resize`) is not built yet",
                );
            }
            if !found.running || applies_live(k) {
                live.push(k.clone());
            } else {
                later.push(k.clone());
            }
            set.push(k.clone());
            d = d.attr(Attribute::change(
                k,
                pending.or(have).map(str::to_string),
                Some(want.clone()),
            ));
        }
        for (k, v) in self.owned_extra(found) {
            set.push(k.to_string());
            if !found.running || applies_live(k) {
                live.push(k.to_string());
            } else {
                later.push(k.to_string());
            }
            d = d.attr(Attribute::change(k, Some(v.to_string()), None));
        }
        if !live.is_empty() && found.running {
            d = d.reason(format!("applies live: {}", live.join(", ")));
        }
        let waiting: Vec<String> = later.iter().chain(&queued).cloned().collect();
        if found.running && !waiting.is_empty() {
            match self.restart {
                RestartPolicy::Allowed => {
                    reboot = true;
                    d = d
                        .attr(Attribute::change(
                            "restart",
                            None,
                            Some("reboot to apply pending changes".into()),
                        ))
                        .reason(format!(
                            "pending until restart: {}; `restart: allowed`, so apply reboots the container",
                            waiting.join(", ")
                        ));
                }
                RestartPolicy::Never if !later.is_empty() => {
                    d = d.reason(format!(
                        "pending until restart: {}; `restart: never`, so they wait for the next restart",
                        later.join(", ")
                    ));
                }
                RestartPolicy::Never => {}
            }
        }
        if !found.running {
            d = d.attr(Attribute::change(
                "status",
                Some("stopped".into()),
                Some("running".into()),
            ));
        }
        d.typed = Some(super::Typed::Container {
            set,
            start: !found.running,
            reboot,
        });
        (!d.attributes.is_empty()).then_some(d)
    }

    /// The whole create, attribute by attribute.
    pub fn create_delta(&self) -> Delta {
        let mut d = Delta::new(Action::Create);
        for (k, v) in &self.config {
            d = d.attr(Attribute::new(k, v.clone()));
        }
        if !self.ssh_public_keys.is_empty() {
            let summary: Vec<String> = self
                .ssh_public_keys
                .iter()
                .map(|k| key_summary(k))
                .collect();
            d = d.attr(Attribute::new("ssh-public-keys", summary.join(", ")));
        }
        if !self.login_keys.is_empty() {
            d = d.attr(Attribute::new("login-keys", self.login_keys.join(", ")));
        }
        d = d.attr(Attribute::new("status", "running"));
        if self.bootstrap {
            d = d.attr(Attribute::new(
                "bootstrap",
                "after start, through node SSH (pct exec/pct push): openssh-server and the keys where missing, host keys recorded from the node; then SSH",
            ));
        }
        d
    }
}

impl Resource for ContainerSpec {
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Container
    }

    fn kind(&self) -> &'static str {
        "container"
    }

    fn name(&self) -> String {
        self.vmid.to_string()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::PveContainer(PveContainerProbe { vmid: self.vmid })]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        Ok(match facts.pve_container(&self.probes()[0])? {
            None => Some(self.create_delta()),
            Some(found) => {
                let adopted = marker_template(found).is_none();
                let delta = self.update_delta(found).map(|d| {
                    if adopted {
                        d.reason(format!(
                            "CT {} was not created by provision: adopted, changed in place, never recreated for its template",
                            self.vmid
                        ))
                    } else {
                        d
                    }
                });
                match &found.misplaced {
                    None => delta,
                    Some((on, declared)) => Some({
                        let mut d = delta
                            .unwrap_or_else(|| Delta::new(Action::Update))
                            .attr(Attribute::change(
                                "node",
                                Some(on.clone()),
                                Some(declared.clone()),
                            ))
                            .reason(format!(
                                "CT {} runs on node `{on}` but is declared on node `{declared}`; moving it is planned only with `--migrate`",
                                self.vmid
                            ));
                        d.typed = Some(super::Typed::Moved {
                            on: on.clone(),
                            declared: declared.clone(),
                        });
                        d
                    }),
                }
            }
        })
    }

    fn ops(&self, change: &Change, allowed: &Allowed) -> Result<Vec<Op>, StepsError> {
        // A container no longer declared is destroyed as a `removed` change (its marker
        // read again, `--allow-destroy`: `Removal::ops`), never through its spec: no plan
        // reaches the API's create-or-update with a `-`.
        if change.action == Action::Delete {
            return Err(StepsError::Refused(format!(
                "destroying CT {} through its spec is not built: a container no longer declared is a `removed` change",
                self.vmid
            )));
        }
        // Through the node's API. Started here unless root-only lines are written first
        // (then their kind's `ApiOp::Start` follows them, and the engine says so).
        Ok(vec![Op::Api(ApiOp::Container {
            address: change.address.clone(),
            spec: self.clone(),
            action: change.action,
            allow_replace: allowed.replace,
            start: true,
        })])
    }
}

/// `ssh-ed25519 …Zk3a user@host`: the type, the key's tail and the comment.
fn key_summary(key: &str) -> String {
    let mut parts = key.split_whitespace();
    let kind = parts.next().unwrap_or("");
    let body = parts.next().unwrap_or("");
    let tail: String = body
        .chars()
        .rev()
        .take(8)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let comment: Vec<&str> = parts.collect();
    format!("{kind} …{tail} {}", comment.join(" "))
        .trim_end()
        .to_string()
}

/// Why a container found on another node of its cluster is not moved.
pub const MIGRATE_NOT_BUILT: &str = "moving a container between nodes (migration) is not built yet; move it with `pct migrate` or declare it on the node it runs on";

/// A container as its node reports it: current and pending configuration, power state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PveContainerFact {
    /// The current configuration's `key: value` lines, raw `lxc.*` lines last in file order
    /// (they may repeat).
    pub config: Vec<(String, String)>,
    /// Values waiting in `[pve:pending]` for a restart.
    pub pending: BTreeMap<String, String>,
    /// Options waiting to be deleted at the next restart.
    pub pending_delete: Vec<String>,
    /// The config's digest, for guarded writes.
    pub digest: String,
    /// Whether it runs.
    pub running: bool,
    /// In a cluster: the node it was found on and the node it is declared on, when they
    /// differ (read through the cluster's resource list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub misplaced: Option<(String, String)>,
}

impl PveContainerFact {
    /// The current value of an option.
    pub fn current(&self, key: &str) -> Option<&str> {
        self.config
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Reads a config file as Proxmox keeps it (`lxc/<vmid>.conf`).
    pub fn from_config(conf: &pve::config::CtConfig, running: bool) -> Self {
        let mut config: Vec<(String, String)> = conf
            .main
            .props
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        config.extend(conf.main.lxc.iter().cloned());
        let mut pending = conf.pending.props.clone();
        pending.remove("delete");
        PveContainerFact {
            config,
            pending,
            pending_delete: conf.pending_delete(),
            digest: conf.digest.clone(),
            running,
            misplaced: None,
        }
    }
}

/// Probe: a container's Proxmox configuration (through the node's API).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct PveContainerProbe {
    /// vmid.
    pub vmid: u64,
}

impl crate::resources::wire::AgentProbe for PveContainerProbe {}

/// Probe: the node's containers whose marker says provision created them at their vmid
/// (through the node's API): those no container of the inventory is are named.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct PveCreatedProbe {
    /// The vmids the inventory declares: not read for a marker (their own read says what
    /// they are), so a whole-inventory check costs no API call per declared container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub except: Vec<u64>,
}

impl crate::resources::wire::AgentProbe for PveCreatedProbe {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::ResourceSpec;

    fn spec() -> ContainerSpec {
        ContainerSpec {
            vmid: 129,
            pve_node: "pve".into(),
            config: vec![
                ("ostemplate".into(), "local:vztmpl/debian.tar.zst".into()),
                ("hostname".into(), "llm".into()),
                ("memory".into(), "2048".into()),
                ("rootfs".into(), "local:8".into()),
                ("unprivileged".into(), "1".into()),
                (
                    "net0".into(),
                    "name=eth0,bridge=vmbr0,ip=10.0.0.2/24,firewall=0".into(),
                ),
                ("mp0".into(), "/srv/data,mp=/shared,backup=0".into()),
                ("tags".into(), "gpu;llm".into()),
            ],
            ssh_public_keys: vec![],
            restart: RestartPolicy::Never,
            bootstrap: false,
            node_keys: Vec::new(),
            login_keys: Vec::new(),
        }
    }

    #[test]
    fn login_keys_are_added_once_and_named_in_the_create() {
        let mut s = spec();
        s.ssh_public_keys = vec!["ssh-ed25519 AAAAkey1 inventory".into()];
        s.add_login_keys([
            (
                "ssh-ed25519 AAAAkey1 other-comment".into(),
                "SHA256:a from identity file k.pub".into(),
            ),
            (
                "ssh-ed25519 AAAAkey2 agent".into(),
                "SHA256:b from ssh-agent at /s".into(),
            ),
        ]);
        assert_eq!(
            s.ssh_public_keys,
            [
                "ssh-ed25519 AAAAkey1 inventory",
                "ssh-ed25519 AAAAkey2 agent"
            ]
        );
        let d = s.create_delta();
        let login = d
            .attributes
            .iter()
            .find(|a| a.name == "login-keys")
            .unwrap();
        assert_eq!(
            login.after.as_deref(),
            Some("SHA256:a from identity file k.pub, SHA256:b from ssh-agent at /s")
        );
    }

    fn found(running: bool) -> PveContainerFact {
        PveContainerFact {
            config: vec![
                (
                    "description".into(),
                    marker_description(
                        "local:vztmpl/debian.tar.zst",
                        129,
                        "2026-01-01T00:00:00Z",
                        "/inv.yaml",
                    ),
                ),
                ("hostname".into(), "llm".into()),
                ("memory".into(), "2048".into()),
                (
                    "rootfs".into(),
                    "local:129/vm-129-disk-0.raw,size=8G".into(),
                ),
                ("unprivileged".into(), "1".into()),
                (
                    "net0".into(),
                    "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:01,ip=10.0.0.2/24,type=veth"
                        .into(),
                ),
                ("mp0".into(), "/srv/data,mp=/shared".into()),
                ("tags".into(), "gpu;llm".into()),
            ],
            running,
            ..Default::default()
        }
    }

    #[test]
    fn converged_container_has_no_delta() {
        assert_eq!(spec().update_delta(&found(true)), None);
    }

    #[test]
    fn a_bind_mount_is_split_into_node_step_lines_and_not_removed_as_unlisted() {
        let mut s = spec();
        let lines = s.split_root_only().expect("mp0 is root-only for a token");
        assert_eq!(lines.label, ROOT_ONLY_LABEL);
        assert_eq!(lines.lines, vec!["mp0: /srv/data,mp=/shared,backup=0"]);
        assert_eq!(s.get("mp0"), None);
        // The API's part converges without touching mp0; the lines match Proxmox's form.
        assert_eq!(s.update_delta(&found(true)), None);
        let facts = Facts::Read(std::collections::HashMap::from([(
            Probe::PveContainer(PveContainerProbe { vmid: 129 }),
            super::super::wire::Fact::PveContainer(Some(found(true))),
        )]));
        assert_eq!(lines.diff(&facts).unwrap(), None);
        // Nothing else in the spec is root-only (nesting alone is a token's).
        assert!(s.split_root_only().is_none());
    }

    #[test]
    fn pending_changes_wait_or_restart() {
        let mut s = spec();
        s.config.push(("mp1".into(), "/srv/more,mp=/more".into()));
        let d = s.update_delta(&found(true)).unwrap();
        assert!(
            d.reasons
                .iter()
                .any(|r| r.contains("pending until restart: mp1"))
        );
        // Once queued, `restart: never` leaves it there without a change.
        let mut f = found(true);
        f.pending.insert("mp1".into(), "/srv/more,mp=/more".into());
        assert_eq!(s.update_delta(&f), None);
        s.restart = RestartPolicy::Allowed;
        let d = s.update_delta(&f).unwrap();
        assert_eq!(d.attributes[0].name, "restart");
        // What apply acts on is typed: no key to write, a reboot.
        assert_eq!(
            d.typed,
            Some(crate::resources::Typed::Container {
                set: Vec::new(),
                start: false,
                reboot: true
            })
        );
    }

    #[test]
    fn a_container_is_one_api_operation_and_its_removal_is_refused_until_built() {
        let s = spec();
        let change = |action| {
            crate::resources::op::bare_change(
                "container.t",
                ResourceSpec::Container(s.clone()),
                action,
            )
        };
        let allowed = Allowed {
            rollback: true,
            replace: false,
            install_driver: false,
        };
        let ops = s.ops(&change(Action::Update), &allowed).unwrap();
        assert!(
            matches!(
                &ops[..],
                [Op::Api(ApiOp::Container {
                    action: Action::Update,
                    start: true,
                    allow_replace: false,
                    ..
                })]
            ),
            "{ops:?}"
        );
        let refused = s.ops(&change(Action::Delete), &allowed).unwrap_err();
        assert!(refused.to_string().contains("not built"), "{refused}");
    }

    #[test]
    fn create_only_change_is_a_replace_and_stopped_is_started() {
        let mut s = spec();
        s.config[0].1 = "local:vztmpl/ubuntu.tar.zst".into();
        assert_eq!(
            s.update_delta(&found(true)).unwrap().action,
            Action::Replace
        );
        let d = spec().update_delta(&found(false)).unwrap();
        assert_eq!(d.attributes[0].name, "status");
        assert_eq!(
            d.typed,
            Some(crate::resources::Typed::Container {
                set: Vec::new(),
                start: true,
                reboot: false
            })
        );
        let mut f = found(true);
        f.config.push(("mp3".into(), "/x,mp=/y".into()));
        let d = spec().update_delta(&f).unwrap();
        assert_eq!(d.attributes[0].after, None);
        assert_eq!(
            d.typed,
            Some(crate::resources::Typed::Container {
                set: vec!["mp3".into()],
                start: false,
                reboot: false
            })
        );
    }
}
