//! What a running container shows of its NVIDIA device nodes and its userspace driver,
//! read from inside it: the device nodes under `/dev/nvidia*` and `/dev/nvidia-caps/*`
//! (and the same under each of the probe's roots, where the lab's stand-in nodes put
//! theirs), each with its major:minor and whether it opens as far as the devices cgroup
//! goes, then `nvidia-smi`'s driver version. One script, run two ways: by the node
//! (`pct exec`, `node/gpu_check.rs`), or by the guest's own agent in the request that
//! reads the guest anyway (no second node login, no `pct exec`, which is Perl on a real
//! node). What the answer is compared with (the node's facts) lives in `node/gpu_check.rs`.

use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::machine::HostError;
use crate::transport::shell_quote;

/// The line between the device nodes and `nvidia-smi`'s answer.
pub const SMI_MARK: &str = "@@provision-smi";

/// How long the agent waits for the script: a healthy GPU answers in about a second (the
/// node's facts, the same `nvidia-smi`, get a minute over SSH); a hung one blocks the
/// opens and `nvidia-smi` for good, and the read that asked would wait hours for its
/// probes.
pub const VIEW_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// What a view that does not end in time means, and where to look.
pub const HUNG_WHY: &str = "a GPU or driver that stopped answering blocks the device opens and nvidia-smi; the node's kernel log (`dmesg`, Xid errors) says which";

/// The `PATH` the script runs with (`pct exec` clears the environment; the agent's login
/// may have a thin one).
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The script that reads what the container shows: one `PATH|major-hex|minor-hex|open`
/// or `...|denied` line per character device found (sorted), [`SMI_MARK`], then the
/// driver version `nvidia-smi` reports (or `absent`). Read-only: each device is opened for
/// reading and closed at once.
pub fn script(roots: &[String], paths: &[String]) -> String {
    let mut extra: Vec<String> = roots
        .iter()
        .filter(|r| !r.is_empty())
        .flat_map(|r| {
            let q = shell_quote(r);
            [format!("{q}/dev/nvidia*"), format!("{q}/dev/nvidia-caps/*")]
        })
        .collect();
    extra.extend(paths.iter().map(|p| shell_quote(p)));
    format!(
        "for f in /dev/nvidia* /dev/nvidia-caps/* {}; do [ -c \"$f\" ] || continue; \
         if e=$( (exec 3<\"$f\") 2>&1 ); then a=open; else case \"$e\" in *'No such device'*) a=open;; *) a=denied;; esac; fi; \
         echo \"$f|$(stat -c '%t|%T' \"$f\")|$a\"; done | sort -u; echo {SMI_MARK}; \
         if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -n1; else echo absent; fi",
        extra.join(" ")
    )
}

/// Probe: what the container this agent runs in shows of its GPUs (see [`script`]), also
/// under each of `roots` and at `paths`. Not a resource's: the plan asks it beside a GPU
/// container's guest read, and compares the answer with its node's facts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuSeenProbe {
    /// Prefixes under which device nodes are also looked for (the lab's `LAB_GPU_ROOT`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roots: Vec<String>,
    /// Device paths looked at wherever they are.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
}

impl crate::resources::wire::AgentProbe for GpuSeenProbe {
    fn answer(
        &self,
        _verify_full: bool,
    ) -> Result<crate::resources::wire::Fact, crate::resources::wire::AnswerError> {
        let mut sh = Command::new("/bin/sh");
        sh.arg("-c")
            .arg(script(&self.roots, &self.paths))
            .env("PATH", PATH);
        let out = crate::machine::output_within(&mut sh, VIEW_LIMIT)
            .map_err(|source| HostError::Spawn {
                program: "/bin/sh".into(),
                source,
            })?
            .ok_or_else(|| HostError::Hung {
                command: "the GPU view script (an open of each /dev/nvidia* node, then nvidia-smi)"
                    .into(),
                limit: VIEW_LIMIT,
                why: HUNG_WHY.into(),
            })?;
        if !out.status.success() {
            return Err(HostError::Exit {
                command: "the GPU view script".into(),
                status: out
                    .status
                    .code()
                    .map_or("a signal".into(), |c| c.to_string()),
                output: String::from_utf8_lossy(&out.stderr).into_owned(),
            }
            .into());
        }
        Ok(crate::resources::wire::Fact::GpuSeen(Some(
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::wire::{AgentProbe, Fact};

    /// On a machine without NVIDIA devices (this one, CI's): no device line, then the
    /// mark and `absent` or a version, as the node's `pct exec` of the same script says.
    /// A device under a root is found there: `/dev/null` (1:3), looked up as a path.
    #[test]
    fn the_agent_answers_with_the_scripts_own_lines() {
        let probe = GpuSeenProbe {
            roots: vec!["/nonexistent-root".into()],
            paths: vec!["/dev/null".into()],
        };
        let Fact::GpuSeen(Some(text)) = probe.answer(false).unwrap() else {
            panic!("not a GPU view");
        };
        let (nodes, smi) = text.split_once(SMI_MARK).expect("the mark");
        assert!(nodes.contains("/dev/null|1|3|open"), "{text}");
        assert!(!smi.trim().is_empty(), "{text}");
    }
}
