//! The NCCL preflight's verdict for people: the healthy report, or the failure as a
//! diagnostic with its causes and remedies.

use crate::diagnostic::Diagnostic;
use crate::gpu::nccl::{self, DetectedBy, NcclOutcome, NcclRun, RankState};

/// The preflight's verdict for people: the healthy report, or the failure as an error with
/// its remedies.
pub fn verdict(run: &NcclRun, gpus: &str) -> Result<String, Box<Diagnostic>> {
    let with_env = |d: Diagnostic| match &run.start {
        Some(s) if !s.nccl_env.is_empty() => {
            let env: Vec<String> = s.nccl_env.iter().map(|(k, v)| format!("{k}={v}")).collect();
            d.cause(format!("ran with {}", env.join(" ")))
        }
        _ => d,
    };
    let failure = match &run.outcome {
        NcclOutcome::Healthy(h) => {
            let mut names = h.device_names.clone();
            names.dedup();
            let mut out = format!(
                "NCCL all-reduce across {} GPUs ({}): healthy\n",
                h.world,
                names.join(", ")
            );
            out += &format!(
                "  bus bandwidth  {:.1} GB/s (algorithm {:.1} GB/s; {:.0} MiB × {}, {:.3} ms each)\n",
                h.busbw_gbps,
                h.algbw_gbps,
                h.bytes as f64 / f64::from(1 << 20),
                h.iters,
                h.time_per_iter_s * 1e3
            );
            out += &format!(
                "  NCCL init      {:.2} s; whole preflight {:.1} s\n",
                h.init_s, run.wall_s
            );
            if let Some(s) = &run.start {
                out += &format!(
                    "  torch {}, CUDA {}, NCCL {}, {}\n",
                    s.torch,
                    s.cuda.as_deref().unwrap_or("none"),
                    s.nccl,
                    s.python
                );
            }
            return Ok(out);
        }
        NcclOutcome::Hung {
            after_s,
            timeout_s,
            detected_by,
            ranks,
        } => {
            let mut d = Diagnostic::new(format!(
                "NCCL all-reduce across GPUs {gpus} hung after {after_s:.1} s (deadline {timeout_s:.0} s)"
            ));
            if *detected_by == DetectedBy::Transport {
                d = d.cause("the launcher itself never reported (stuck importing torch or initializing CUDA?)");
            }
            d = with_env(rank_causes(d, ranks, false));
            nccl::hang_remedies().into_iter().fold(d, Diagnostic::hint)
        }
        NcclOutcome::Crashed {
            rank,
            code,
            after_s,
            wrong_sum,
            ranks,
        } => {
            let what = if wrong_sum.is_some() {
                format!("rank {rank} got a wrong all-reduce sum")
            } else {
                format!("rank {rank} exited with status {code}")
            };
            let mut d = Diagnostic::new(format!(
                "NCCL all-reduce across GPUs {gpus} failed after {after_s:.1} s: {what}"
            ));
            if let Some(w) = wrong_sum {
                d = d.cause(format!("sum check: {w}"));
            }
            d = with_env(rank_causes(d, ranks, true));
            d.hint("rerun with --env NCCL_DEBUG=INFO to see NCCL's own messages")
        }
        NcclOutcome::TooFewGpus {
            wanted,
            visible,
            cuda_visible_devices,
        } => {
            let wanted: Vec<String> = wanted.iter().map(ToString::to_string).collect();
            let mut d = Diagnostic::new(format!(
                "asked for CUDA devices {} but torch sees {visible} GPU(s)",
                wanted.join(",")
            ));
            if let Some(cvd) = cuda_visible_devices {
                d = d.cause(format!("CUDA_VISIBLE_DEVICES={cvd}"));
            }
            d.hint("check that the container sees every GPU of the service (`provision gpu check`)")
                .hint("check CUDA_VISIBLE_DEVICES in the service's environment")
        }
        NcclOutcome::TorchMissing { python, error } => {
            Diagnostic::new(format!("torch is not installed for {python}"))
                .cause(error.clone())
                .hint("point --python at the ml-env's python, e.g. /root/ml-env/bin/python")
        }
        NcclOutcome::NcclMissing { python, torch } => {
            Diagnostic::new(format!("torch {torch} at {python} was built without NCCL"))
                .hint("install a CUDA build of torch in the ml-env")
        }
    };
    Err(Box::new(failure))
}

/// One cause line per rank, with the end of its output when it has any.
fn rank_causes(mut d: Diagnostic, ranks: &[RankState], stderr_first: bool) -> Diagnostic {
    for r in ranks {
        d = d.cause(format!("rank {}: {} for {:.1} s", r.rank, r.stage, r.for_s));
        let lines = if stderr_first && !r.stderr_tail.is_empty() {
            &r.stderr_tail
        } else if !r.stdout_tail.is_empty() {
            &r.stdout_tail
        } else {
            &r.stderr_tail
        };
        let shown = &lines[lines.len().saturating_sub(8)..];
        for line in shown {
            d = d.cause(format!("  | {line}"));
        }
    }
    d
}
