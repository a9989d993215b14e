//! What can go wrong talking to a node's API. Every variant names the node and the call: a
//! read that fails is an error, never "absent", so it can never plan a create.

use std::collections::BTreeMap;

/// A failed Proxmox API call or task.
#[derive(Debug, thiserror::Error)]
pub enum ProxmoxError {
    /// The inventory's API settings cannot be used (a variable not set, a bad pin).
    #[error("node `{node}`: {message}")]
    Settings {
        /// The node's inventory name.
        node: String,
        /// What is wrong, with a hint.
        message: String,
    },
    /// 401: the token or ticket was refused.
    #[error(
        "{call} on node `{node}`: authentication refused ({message})\nhint: check the token or password the inventory references"
    )]
    Unauthorized {
        /// The node's inventory name.
        node: String,
        /// `GET /nodes/pve/lxc/129/config`.
        call: String,
        /// The server's reason.
        message: String,
    },
    /// 403: authenticated, but not allowed.
    #[error(
        "{call} on node `{node}`: permission denied ({message})\nhint: the token needs VM.Audit to read and VM.Config.* / VM.PowerMgmt to change containers; root@pam-only changes need `password:` (a root@pam ticket)"
    )]
    Forbidden {
        /// The node's inventory name.
        node: String,
        /// The call.
        call: String,
        /// The server's reason.
        message: String,
    },
    /// No HTTP answer: refused, reset, TLS refused, timed out.
    #[error("{call} on node `{node}`: no answer: {message}")]
    Unreachable {
        /// The node's inventory name.
        node: String,
        /// The call.
        call: String,
        /// Why.
        message: String,
    },
    /// The config changed between read and write (`digest` no longer matches).
    #[error("{call} on node `{node}`: the configuration changed since it was read ({message})")]
    Modified {
        /// The node's inventory name.
        node: String,
        /// The call.
        call: String,
        /// The server's reason.
        message: String,
    },
    /// Any other error status.
    #[error("{call} on node `{node}` failed: {status} {message}{}", params_text(.errors))]
    Api {
        /// The node's inventory name.
        node: String,
        /// The call.
        call: String,
        /// HTTP status.
        status: u16,
        /// The server's reason.
        message: String,
        /// Per-parameter errors.
        errors: BTreeMap<String, String>,
    },
    /// A task ended with an exit status other than `OK`.
    #[error("task {kind} on node `{node}` failed: {exitstatus}\n{log}")]
    Task {
        /// The node's inventory name.
        node: String,
        /// The task type and id (`vzcreate 129`).
        kind: String,
        /// `exitstatus`.
        exitstatus: String,
        /// The task log's last lines.
        log: String,
    },
}

fn params_text(errors: &BTreeMap<String, String>) -> String {
    errors
        .iter()
        .map(|(k, v)| format!("\n  {k}: {v}"))
        .collect()
}

impl ProxmoxError {
    /// Classifies an API error of `call` on `node`.
    pub fn from_api(node: &str, call: &str, e: pve::ApiError) -> Self {
        let (node, call, message) = (node.to_string(), call.to_string(), e.message.clone());
        match e.status {
            401 => ProxmoxError::Unauthorized {
                node,
                call,
                message,
            },
            403 => ProxmoxError::Forbidden {
                node,
                call,
                message,
            },
            pve::client::NO_ANSWER => ProxmoxError::Unreachable {
                node,
                call,
                message,
            },
            _ if e.message.contains("detected modified configuration") => ProxmoxError::Modified {
                node,
                call,
                message,
            },
            status => ProxmoxError::Api {
                node,
                call,
                status,
                message,
                errors: e.errors,
            },
        }
    }
}
