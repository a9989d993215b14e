//! `pct` on the lab node: `exec`, `push`, `config`, `set`, `start`, `stop`, `shutdown`,
//! `status`, `list`, over the same configs and locks as the API (`pct exec` is `lxc-attach`,
//! as on Proxmox). Errors go to stderr with exit status 255, as Proxmox's CLI does.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use crate::error::{ApiError, ApiResult};
use crate::node::{ConfigUpdate, Node};
use crate::paths::Settings;
use crate::pve::config::split_list;

const USAGE: &str =
    "USAGE: pct <exec|push|config|set|start|stop|shutdown|status|list> <vmid> [OPTIONS]";

/// Runs `pct` with its arguments; returns the exit status.
pub fn main(lab: Settings, args: &[String]) -> i32 {
    let node = Node::new(lab);
    match dispatch(&node, args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{e}");
            255
        }
    }
}

fn vmid_arg(args: &[String], i: usize) -> ApiResult<u32> {
    let v = args
        .get(i)
        .ok_or_else(|| ApiError::new(400, format!("400 not enough arguments\n{USAGE}")))?;
    v.parse().map_err(|_| ApiError::new(400, format!("400 Parameter verification failed.\nvmid: type check ('integer') failed - got '{v}'")))
}

/// `--key value` pairs after the positional arguments.
fn options(args: &[String]) -> ApiResult<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let Some(k) = a.strip_prefix("--").or_else(|| a.strip_prefix('-')) else {
            return Err(ApiError::new(
                400,
                format!("400 too many arguments\n{USAGE}"),
            ));
        };
        let (k, v) = match k.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (
                k.to_string(),
                it.next().cloned().unwrap_or_else(|| "1".into()),
            ),
        };
        out.insert(k, v);
    }
    Ok(out)
}

fn log(line: &str) {
    println!("{line}");
}

fn dispatch(node: &Node, args: &[String]) -> ApiResult<i32> {
    let cmd = args.first().map(String::as_str).unwrap_or("");
    match cmd {
        "list" => {
            println!("{:<10} {:<10} {:<6} Name", "VMID", "Status", "Lock");
            for vmid in node.list() {
                let conf = node.load(vmid)?;
                let status = if node.is_running(vmid) {
                    "running"
                } else {
                    "stopped"
                };
                let name = conf.get("hostname").unwrap_or("");
                println!(
                    "{vmid:<10} {status:<10} {:<6} {name}",
                    conf.lock().unwrap_or("")
                );
            }
            Ok(0)
        }
        "status" => {
            let vmid = vmid_arg(args, 1)?;
            node.load(vmid)?;
            println!(
                "status: {}",
                if node.is_running(vmid) {
                    "running"
                } else {
                    "stopped"
                }
            );
            Ok(0)
        }
        "start" => {
            let vmid = vmid_arg(args, 1)?;
            node.load(vmid)?;
            if node.is_running(vmid) {
                return Err(ApiError::die(format!("CT {vmid} already running")));
            }
            node.start(vmid, &log).map(|_| 0)
        }
        "stop" | "shutdown" => {
            let vmid = vmid_arg(args, 1)?;
            node.load(vmid)?;
            if !node.is_running(vmid) {
                return Err(ApiError::die(format!("CT {vmid} not running")));
            }
            let opts = options(&args[2..])?;
            if cmd == "stop" {
                node.stop(vmid, &log).map(|_| 0)
            } else {
                let timeout = opts
                    .get("timeout")
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(60);
                node.shutdown(
                    vmid,
                    timeout,
                    opts.get("forceStop").is_some_and(|v| v == "1"),
                    &log,
                )
                .map(|_| 0)
            }
        }
        "config" => {
            let vmid = vmid_arg(args, 1)?;
            let opts = options(&args[2..])?;
            let conf = node.load(vmid)?;
            let mut props = conf.main.props.clone();
            if opts.get("current").is_none_or(|v| v != "1") {
                for (k, v) in &conf.pending.props {
                    if k != "delete" {
                        props.insert(k.clone(), v.clone());
                    }
                }
                for k in conf.pending_delete() {
                    props.remove(&k);
                }
            }
            // The description first, as `#` lines, like the file.
            for line in props.remove("description").unwrap_or_default().lines() {
                println!("#{line}");
            }
            for (k, v) in props {
                println!("{k}: {v}");
            }
            for (k, v) in &conf.main.lxc {
                println!("{k}: {v}");
            }
            Ok(0)
        }
        "set" => {
            let vmid = vmid_arg(args, 1)?;
            let mut opts = options(&args[2..])?;
            let delete = split_list(&opts.remove("delete").unwrap_or_default());
            let revert = split_list(&opts.remove("revert").unwrap_or_default());
            let digest = opts.remove("digest");
            let upd = ConfigUpdate {
                set: opts,
                delete,
                revert,
                digest,
            };
            node.update_config(vmid, &upd, &log).map(|_| 0)
        }
        "exec" => {
            let vmid = vmid_arg(args, 1)?;
            node.load(vmid)?;
            if !node.is_running(vmid) {
                return Err(ApiError::die(format!("CT {vmid} not running")));
            }
            let rest: Vec<&String> = args[2..].iter().skip_while(|a| *a == "--").collect();
            if rest.is_empty() {
                return Err(ApiError::new(400, "missing command"));
            }
            let err = attach(node, vmid).arg("--").args(rest).exec();
            Err(ApiError::die(format!("exec lxc-attach failed: {err}")))
        }
        "push" => {
            let vmid = vmid_arg(args, 1)?;
            let (Some(src), Some(dest)) = (args.get(2), args.get(3)) else {
                return Err(ApiError::new(
                    400,
                    format!("400 not enough arguments\n{USAGE}"),
                ));
            };
            let opts = options(&args[4..])?;
            node.load(vmid)?;
            if !node.is_running(vmid) {
                return Err(ApiError::die(format!("CT {vmid} not running")));
            }
            let file = std::fs::File::open(src)
                .map_err(|e| ApiError::die(format!("unable to open file '{src}' - {e}")))?;
            let perms = opts.get("perms").cloned().unwrap_or_else(|| "0644".into());
            let owner = match (opts.get("user"), opts.get("group")) {
                (Some(u), Some(g)) => format!("{u}:{g}"),
                (Some(u), None) => u.clone(),
                (None, Some(g)) => format!(":{g}"),
                (None, None) => "0:0".into(),
            };
            let script = "cat > \"$1\" && chmod \"$2\" \"$1\" && chown \"$3\" \"$1\"";
            let status = attach(node, vmid)
                .args(["--", "/bin/sh", "-c", script, "sh", dest, &perms, &owner])
                .stdin(Stdio::from(file))
                .status()?;
            if !status.success() {
                return Err(ApiError::die(format!(
                    "failed to write file '{dest}' in CT {vmid}"
                )));
            }
            Ok(0)
        }
        _ => Err(ApiError::new(
            400,
            format!("unknown command 'pct {cmd}'\n{USAGE}"),
        )),
    }
}

fn attach(node: &Node, vmid: u32) -> Command {
    let mut c = Command::new("lxc-attach");
    c.arg("-P").arg(node.lab.lxc_path()).args([
        "-n",
        &vmid.to_string(),
        "--clear-env",
        "--keep-var",
        "TERM",
    ]);
    c
}
