//! Embeds the agent the CLI pushes to its targets: the static build of `crates/agent` that
//! `scripts/build-agent` writes where `PROVISION_AGENT` (set in `.cargo/config.toml`) says,
//! compressed once here (zstd, and gzip for targets without zstd), with its sha256. Cargo cannot build it from here (a
//! nested cargo on the same target directory waits on its own lock), so the scripts build
//! it first; without it the CLI carries no agent and says so when it needs one.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

fn main() {
    println!("cargo::rustc-check-cfg=cfg(embedded_agent)");
    println!("cargo::rerun-if-env-changed=PROVISION_AGENT");
    // The agent's own build (no CLI) embeds nothing: it is what gets embedded.
    if std::env::var_os("CARGO_FEATURE_CLI").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let Some(agent) = std::env::var_os("PROVISION_AGENT").map(PathBuf::from) else {
        return;
    };
    println!("cargo::rerun-if-changed={}", agent.display());
    let Ok(bytes) = std::fs::read(&agent) else {
        return;
    };
    let sha = hex::encode(Sha256::digest(&bytes));
    let zst = out.join("agent.zst");
    let gz = out.join("agent.gz");
    let sha_file = out.join("agent.sha256");
    // Compressing at the highest levels takes seconds: only when the agent changed, and
    // here rather than in every run that meets a target without zstd.
    if std::fs::read_to_string(&sha_file).ok().as_deref() != Some(sha.as_str())
        || !zst.exists()
        || !gz.exists()
    {
        let packed = zstd::bulk::compress(&bytes, 19).expect("zstd compresses in memory");
        std::fs::write(&zst, packed).expect("OUT_DIR is writable");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        std::io::Write::write_all(&mut enc, &bytes).expect("gzip compresses in memory");
        std::fs::write(&gz, enc.finish().expect("gzip compresses in memory"))
            .expect("OUT_DIR is writable");
        std::fs::write(&sha_file, &sha).expect("OUT_DIR is writable");
    }
    println!("cargo::rustc-cfg=embedded_agent");
    // An agent older than the sources it is built from answers with yesterday's code.
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let sources = [manifest.join("src"), manifest.join("crates/agent/src")];
    for dir in &sources {
        println!("cargo::rerun-if-changed={}", dir.display());
    }
    let built = std::fs::metadata(&agent).and_then(|m| m.modified()).ok();
    let newest = sources.iter().filter_map(|d| newest(d)).max();
    if let (Some(built), Some(newest)) = (built, newest)
        && newest > built
    {
        println!(
            "cargo::warning=the embedded agent ({}) is older than the sources; run scripts/build-agent",
            agent.display()
        );
    }
}

/// The newest modification time of a file under `dir`.
fn newest(dir: &Path) -> Option<SystemTime> {
    let mut best = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let t = if path.is_dir() {
            newest(&path)
        } else {
            entry.metadata().and_then(|m| m.modified()).ok()
        };
        best = best.max(t);
    }
    best
}
