//! Shared by the `hub_*` tests: a fake hub on loopback and checks of what landed on disk.

#![allow(dead_code)]

use std::path::Path;

use fakehub::{Config, FakeHub, FileSpec, RepoSpec};

/// An inventory's `models:` entry (indented by 10) for `repo` at `main` from `hub`, in
/// `/shared/models/FOLDER`.
pub fn model_entry(key: &str, repo: &str, folder: &str, hub: &FakeHub) -> String {
    format!(
        "          {key}:
            repo: {repo}
            revision: main
            path: /shared/models/{folder}
            endpoint: {endpoint}
",
        endpoint = hub.endpoint()
    )
}

/// The token the gated repo accepts.
pub const TOKEN: &str = "hf_fakehubtesttoken_5f2c1e";

/// A small model: two 12 MiB shards (several 1 MiB ranges each), a 7 MiB tokenizer, small
/// json files in git, one in a folder, and an empty file.
pub fn model(id: &str) -> RepoSpec {
    let mut r = RepoSpec::synthetic(id, 2, 12 << 20);
    r.files.push(FileSpec::small("empty.txt", 0));
    r
}

/// A hub serving `org/model`, gated `org/gated` and `org/big` (sized for the disk-full test),
/// with three tree entries per page so pagination is exercised.
pub fn hub() -> FakeHub {
    let mut gated = model("org/gated");
    gated.gated = true;
    let big = RepoSpec::synthetic("org/big", 2, 24 << 20);
    FakeHub::start(Config {
        repos: vec![model("org/model"), gated, big],
        token: Some(TOKEN.to_string()),
        page_size: 3,
        hash_cache: None,
        ..Config::default()
    })
    .expect("fake hub starts")
}

/// Asserts every file of `repo` is in `dest`, byte for byte.
pub fn assert_identical(repo: &RepoSpec, dest: &Path) {
    for f in &repo.files {
        let got = std::fs::read(dest.join(&f.path)).unwrap_or_else(|e| panic!("{}: {e}", f.path));
        let want = fakehub::bytes(&repo.id, &f.path, f.size);
        assert!(got == want, "{} differs from the hub's bytes", f.path);
    }
}

/// Files left behind that are not model files (parts, sidecars, temporaries).
pub fn leftovers(dest: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dest.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let name = p.file_name().unwrap().to_string_lossy().to_string();
                if name.ends_with(".part") || name.ends_with(".part.json") || name.ends_with(".tmp")
                {
                    out.push(name);
                }
            }
        }
    }
    out
}

/// Flips one byte of a file in place, keeping its size and mtime (what a metadata check
/// cannot see).
pub fn corrupt_keeping_mtime(path: &Path, offset: u64) {
    use std::os::unix::fs::FileExt;
    let meta = std::fs::metadata(path).unwrap();
    let mtime = meta.modified().unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 0x5a;
    f.write_all_at(&b, offset).unwrap();
    f.set_times(std::fs::FileTimes::new().set_modified(mtime))
        .unwrap();
}
