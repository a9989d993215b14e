//! `provision render`: every file the inventory produces, one per target path.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use super::{ExitStatus, prepare};
use crate::engine::DesiredTarget;
use crate::plan::Target;
use crate::printer::Printer;
use crate::resources::ResourceSpec;

/// Arguments of `provision render`.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// The inventory file.
    pub inventory: PathBuf,
    /// Write the files under this folder (`<folder>/<target>/<path>`); without it, print them.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// A rendered file: where it goes and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedFile {
    /// `guest/<container>/<path>` or `node/<node>/<config root>/lxc/<vmid>.conf.d/<label>.conf`.
    pub relative: PathBuf,
    /// The content.
    pub content: String,
}

/// Every file the desired state holds: guest files, and the Proxmox config lines a role
/// keeps in a container's config (as a fragment of that config).
pub fn rendered_files(
    desired: &[DesiredTarget],
    config_root: &dyn Fn(&str) -> String,
) -> Vec<RenderedFile> {
    let mut files = Vec::new();
    for t in desired {
        for d in &t.resources {
            match (&t.target, &d.spec) {
                (Target::Guest { name, .. }, ResourceSpec::File(f)) => files.push(RenderedFile {
                    relative: Path::new("guest")
                        .join(name)
                        .join(f.path.trim_start_matches('/')),
                    content: f.content.clone(),
                }),
                (Target::Container { node, .. }, ResourceSpec::PveLines(l)) => {
                    let root = config_root(node);
                    files.push(RenderedFile {
                        relative: Path::new("node")
                            .join(node)
                            .join(root.trim_start_matches('/'))
                            .join("lxc")
                            .join(format!("{}.conf.d", l.vmid))
                            .join(format!("{}.conf", l.label)),
                        content: format!(
                            "# Lines provision keeps in {root}/lxc/{}.conf (role {}).\n{}\n",
                            l.vmid,
                            d.role.as_deref().unwrap_or("-"),
                            l.lines.join("\n")
                        ),
                    });
                }
                _ => {}
            }
        }
    }
    files
}

/// Runs `provision render`.
pub fn run(args: &RenderArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
    let prepared = prepare(&args.inventory)?;
    let nodes = &prepared.loaded.inventory.nodes;
    let files = rendered_files(&prepared.desired, &|node| {
        nodes
            .get(node)
            .map_or("/etc/pve".to_string(), |n| n.config_root.to_string())
    });
    match &args.out {
        Some(dir) => {
            for f in &files {
                let path = dir.join(&f.relative);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)
                        .with_context(|| format!("cannot create {}", parent.display()))?;
                }
                std::fs::write(&path, &f.content)
                    .with_context(|| format!("cannot write {}", path.display()))?;
                printer.result(&format!("{}\n", path.display()));
            }
        }
        None => {
            for f in &files {
                printer.result(&format!(
                    "==> {} <==\n{}\n",
                    f.relative.display(),
                    f.content
                ));
            }
        }
    }
    Ok(ExitStatus::Success)
}
