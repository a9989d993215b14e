//! The top of an inventory: Proxmox nodes, how to reach them, and their containers.

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::container::Container;
use super::node_setup::{ModelStorage, NvidiaHost, TemplateSource};
use super::secret::SecretRef;
use super::setting::Setting;
use super::spanned::Sp;
use super::text::{AbsPath, Host, LocalPath, Name, Text};

/// An inventory: Proxmox nodes and the containers each should run.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Inventory {
    /// Folders of your own roles and templates, relative to this file. They are searched
    /// before the roles and templates built into provision, so a file of the same name
    /// replaces the built-in one.
    #[serde(default)]
    pub paths: Paths,
    /// Proxmox VE nodes, by a name of your choosing.
    pub nodes: IndexMap<Name, Node>,
}

/// Where user roles and templates live.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Paths {
    /// A folder of role files (`<name>.yaml`).
    pub roles: Option<Sp<LocalPath>>,
    /// A folder of handlebars templates (`<name>.hbs`).
    pub templates: Option<Sp<LocalPath>>,
}

/// One Proxmox VE node.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Node {
    /// The node's HTTP API.
    pub api: Api,
    /// SSH to the node as root: for the edits the API reserves to `root@pam` (device
    /// passthrough, raw `lxc.*` lines) and for `pct exec` before a guest has SSH.
    pub ssh: SshTarget,
    /// The Proxmox cluster this node is a member of (any name; nodes naming the same
    /// cluster are one). A container is then looked for on every node of the cluster, and
    /// one found on another node than declared is drift naming both nodes.
    #[serde(default)]
    pub cluster: Option<Sp<Name>>,
    /// Where the node keeps its cluster configuration.
    #[serde(default = "default_config_root")]
    pub config_root: Sp<AbsPath>,
    /// The storage behind the containers' `/shared` (a ZFS dataset or a directory).
    pub model_storage: Option<ModelStorage>,
    /// Container templates the node must have, fetched with their checksum when missing.
    #[serde(default)]
    pub templates: Vec<TemplateSource>,
    /// The NVIDIA driver side of the host.
    pub nvidia: Option<NvidiaHost>,
    /// Containers on this node, by name.
    #[serde(default)]
    pub containers: IndexMap<Name, Container>,
}

fn default_config_root() -> Sp<AbsPath> {
    Sp::new(AbsPath::parse("/etc/pve").expect("valid default"))
}

/// How to reach and trust a node's API.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Api {
    /// Base URL, e.g. `https://10.1.2.6:8006`, or `{ env: PVE_URL }`; `/api2/json` is added
    /// when missing.
    pub url: Sp<Setting>,
    /// The node's name as Proxmox knows it (the `node` in `/nodes/{node}`).
    pub node: Sp<Name>,
    /// An API token `USER@REALM!TOKENID=SECRET`, by reference.
    pub token: Option<Sp<SecretRef>>,
    /// A password of `user`, by reference: provision then logs in for a ticket (renewed
    /// before its two hours run out). root@pam may change what a token may not (bind
    /// mounts, device passthrough, features other than nesting).
    pub password: Option<Sp<SecretRef>>,
    /// The user `password` belongs to.
    #[serde(default = "default_api_user")]
    pub user: Sp<Text>,
    /// How to trust the node's TLS certificate (exactly one way).
    pub tls: Tls,
}

/// Trust for a node's self-signed certificate: a CA file or a pinned fingerprint.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Tls {
    /// SHA-256 fingerprint of the node's certificate, `AB:CD:...` (as `pvenode cert info`
    /// prints it) or plain hex, or `{ env: PVE_FINGERPRINT }`.
    pub fingerprint: Option<Sp<Setting>>,
    /// A PEM file with the CA that signed the node's certificate.
    pub ca_file: Option<Sp<LocalPath>>,
}

/// An SSH destination.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SshTarget {
    /// Host name or address; for a container, defaults to its first network address.
    pub host: Option<Sp<Host>>,
    /// Port.
    #[serde(default = "default_ssh_port")]
    pub port: Sp<u16>,
    /// User to log in as.
    #[serde(default = "default_ssh_user")]
    pub user: Sp<Name>,
    /// Private key file; without it, the SSH agent and `~/.ssh/config` are used.
    pub identity_file: Option<Sp<LocalPath>>,
    /// A host to jump through (`user@host:port`), as OpenSSH's `ProxyJump`.
    pub proxy_jump: Option<Sp<Text>>,
}

impl Default for SshTarget {
    fn default() -> Self {
        SshTarget {
            host: None,
            port: default_ssh_port(),
            user: default_ssh_user(),
            identity_file: None,
            proxy_jump: None,
        }
    }
}

fn default_api_user() -> Sp<Text> {
    Sp::new(Text::parse("root@pam").expect("valid default"))
}

fn default_ssh_port() -> Sp<u16> {
    Sp::new(22)
}

fn default_ssh_user() -> Sp<Name> {
    Sp::new(Name::parse("root").expect("valid default"))
}
