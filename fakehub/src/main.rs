//! `fake-hub`: serves generated repositories until killed, printing one JSON line with its
//! URLs once it is ready.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Parser;
use fakehub::{Config, FakeHub, RepoSpec, parse_size};

/// A local Hugging Face hub with generated, deterministic files (for tests and benchmarks).
#[derive(Debug, Parser)]
#[command(name = "fake-hub", version, about)]
struct Args {
    /// Address the hub listens on (a lab bridge address lets containers reach it).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Address the CDN listens on; by default the hub's IP and any free port.
    #[arg(long)]
    cdn_listen: Option<SocketAddr>,
    /// A synthetic model repo: `ID=SHARDSxSIZE`, e.g. `bench/model=8x1GiB`.
    #[arg(long = "synthetic", value_name = "ID=NxSIZE")]
    synthetic: Vec<String>,
    /// Repositories from a JSON file: a list of `{id, files: [{path, size, lfs}], gated}`.
    #[arg(long)]
    repos: Option<PathBuf>,
    /// Mark a repo gated (needs the token).
    #[arg(long = "gated", value_name = "ID")]
    gated: Vec<String>,
    /// Environment variable holding the token gated repos accept.
    #[arg(long, value_name = "VAR")]
    token_env: Option<String>,
    /// Tree entries per page.
    #[arg(long, default_value_t = 1000)]
    page_size: usize,
    /// Serve LFS files from the hub itself instead of redirecting to the CDN.
    #[arg(long)]
    no_cdn: bool,
    /// Where sha256 of large generated files are cached across runs.
    #[arg(long, default_value = "/var/cache/provision-fakehub")]
    hash_cache: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut repos = Vec::new();
    for s in &args.synthetic {
        let (id, spec) = s
            .split_once('=')
            .with_context(|| format!("`{s}`: expected ID=SHARDSxSIZE"))?;
        let (n, size) = spec
            .split_once('x')
            .with_context(|| format!("`{spec}`: expected SHARDSxSIZE"))?;
        let n: usize = n.parse().with_context(|| format!("`{n}`: not a count"))?;
        let Some(size) = parse_size(size) else {
            bail!("`{size}`: not a size (try 1GiB, 64MiB)");
        };
        repos.push(RepoSpec::synthetic(id, n, size));
    }
    if let Some(path) = &args.repos {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let more: Vec<RepoSpec> = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a list of repos", path.display()))?;
        repos.extend(more);
    }
    for id in &args.gated {
        let Some(r) = repos.iter_mut().find(|r| &r.id == id) else {
            bail!("--gated {id}: no such repo");
        };
        r.gated = true;
    }
    let token = match &args.token_env {
        Some(var) => Some(std::env::var(var).with_context(|| format!("{var} is not set"))?),
        None => None,
    };
    let hub = FakeHub::start(Config {
        listen: args.listen,
        cdn_listen: args.cdn_listen,
        cdn: !args.no_cdn,
        repos: repos.clone(),
        token,
        page_size: args.page_size,
        hash_cache: Some(args.hash_cache),
    })
    .context("cannot start the fake hub")?;
    let listed: Vec<_> = repos
        .iter()
        .map(|r| serde_json::json!({ "id": r.id, "commit": hub.commit(&r.id) }))
        .collect();
    println!(
        "{}",
        serde_json::json!({ "endpoint": hub.endpoint(), "cdn": hub.cdn(), "repos": listed })
    );
    loop {
        std::thread::park();
    }
}
