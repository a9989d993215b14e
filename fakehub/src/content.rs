//! Repositories and their files. File bytes are a pure function of (repo, path, offset), so
//! multi-GiB files need no disk and any range can be served directly; only the sha256 of large
//! files costs a full pass, done once and cached on disk.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha1::Sha1;
use sha2::{Digest, Sha256};

/// Bumped whenever the generator changes, so cached hashes from an older one are not reused.
const GENERATOR_VERSION: u32 = 2;

/// One repository served by the fake hub.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RepoSpec {
    /// `org/name`.
    pub id: String,
    /// Files, in any order; paths may contain `/`.
    pub files: Vec<FileSpec>,
    /// Whether downloads need a token (`Authorization: Bearer <token>`).
    #[serde(default)]
    pub gated: bool,
    /// Branch and tag names that resolve to the repo's one commit (besides the commit itself).
    #[serde(default = "default_refs")]
    pub refs: Vec<String>,
}

fn default_refs() -> Vec<String> {
    vec!["main".to_string()]
}

/// One file of a repository.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileSpec {
    /// Path inside the repo.
    pub path: String,
    /// Size in bytes (taken from `content` when that is given).
    #[serde(default)]
    pub size: u64,
    /// Stored in LFS (served through the CDN, listed with `lfs.oid`), as large files are.
    pub lfs: bool,
    /// The file's text, for files a consumer parses (a `config.json` a server reads);
    /// `size` is then its length. Without it, the bytes are generated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

impl RepoSpec {
    /// A repo laid out like a sharded safetensors model: `shards` LFS files of `shard_size`
    /// bytes plus the small JSON and text files a real model has, one of them in a folder.
    pub fn synthetic(id: &str, shards: usize, shard_size: u64) -> RepoSpec {
        let mut files = vec![
            FileSpec::small(".gitattributes", 1519),
            FileSpec::small("README.md", 4_200),
            FileSpec::small("config.json", 1_337),
            FileSpec::small("generation_config.json", 210),
            FileSpec::small("tokenizer_config.json", 9_871),
            FileSpec::small("original/params.json", 199),
            FileSpec::small("model.safetensors.index.json", 23_456),
            FileSpec {
                path: "tokenizer.json".into(),
                size: 7_031_673,
                lfs: true,
                content: None,
            },
        ];
        for i in 1..=shards {
            files.push(FileSpec {
                path: format!("model-{i:05}-of-{shards:05}.safetensors"),
                size: shard_size,
                lfs: true,
                content: None,
            });
        }
        RepoSpec {
            id: id.to_string(),
            files,
            gated: false,
            refs: default_refs(),
        }
    }

    /// The repo's commit: derived from its id and file list, so it changes when they do.
    pub fn commit(&self) -> String {
        let mut h = Sha1::new();
        h.update(self.id.as_bytes());
        for f in &self.files {
            h.update(format!("\0{}\0{}\0{}", f.path, f.size, f.lfs).as_bytes());
            if let Some(text) = &f.content {
                h.update(text.as_bytes());
            }
        }
        hex::encode(h.finalize())
    }

    /// The file at `path`, if any.
    pub fn file(&self, path: &str) -> Option<&FileSpec> {
        self.files.iter().find(|f| f.path == path)
    }
}

impl FileSpec {
    /// A small file kept in git (not LFS).
    pub fn small(path: &str, size: u64) -> FileSpec {
        FileSpec {
            path: path.to_string(),
            size,
            lfs: false,
            content: None,
        }
    }

    /// A small file with this text.
    pub fn text(path: &str, text: &str) -> FileSpec {
        FileSpec {
            path: path.to_string(),
            size: text.len() as u64,
            lfs: false,
            content: Some(text.to_string()),
        }
    }

    /// Its bytes when given as text.
    pub fn literal(&self) -> Option<&[u8]> {
        self.content.as_deref().map(str::as_bytes)
    }
}

/// The generator's seed for one file.
pub fn seed(repo: &str, path: &str) -> u64 {
    let d = Sha256::digest(format!("{repo}\0{path}").as_bytes());
    u64::from_le_bytes(d[..8].try_into().expect("8 bytes"))
}

/// splitmix64: a good 64-bit mix.
#[inline]
fn mix(seed: u64, index: u64) -> u64 {
    let mut z = seed.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Words in the shared random pool (1 MiB).
const POOL_WORDS: u64 = 1 << 17;

/// A fixed random pool; a file's word `i` is pool word `i mod POOL_WORDS` xor a constant of
/// the file and of the MiB block: random access at memory speed, so the hub's CPU stays out
/// of the benchmark, and no two blocks or files are alike.
fn pool() -> &'static [u64] {
    static POOL: std::sync::OnceLock<Vec<u64>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| (0..POOL_WORDS).map(|i| mix(0x5EED_F00D, i)).collect())
}

#[inline]
fn word(seed: u64, index: u64) -> u64 {
    pool()[(index % POOL_WORDS) as usize] ^ mix(seed, index / POOL_WORDS)
}

/// Fills `buf` with the file's bytes starting at `offset`.
pub fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
    let pool = pool();
    let mut pos = 0usize;
    let mut off = offset;
    // Unaligned head.
    while pos < buf.len() && !off.is_multiple_of(8) {
        buf[pos] = word(seed, off / 8).to_le_bytes()[(off % 8) as usize];
        pos += 1;
        off += 1;
    }
    let mut index = off / 8;
    let mut chunks = buf[pos..].chunks_exact_mut(8);
    let mut block = u64::MAX;
    let mut key = 0;
    for c in &mut chunks {
        if index / POOL_WORDS != block {
            block = index / POOL_WORDS;
            key = mix(seed, block);
        }
        c.copy_from_slice(&(pool[(index % POOL_WORDS) as usize] ^ key).to_le_bytes());
        index += 1;
    }
    let tail = chunks.into_remainder();
    let w = word(seed, index).to_le_bytes();
    let n = tail.len();
    tail.copy_from_slice(&w[..n]);
}

/// The whole content of a file (for small files and tests).
pub fn bytes(repo: &str, path: &str, size: u64) -> Vec<u8> {
    let mut v = vec![0u8; size as usize];
    fill(seed(repo, path), 0, &mut v);
    v
}

/// Hashes of one file, as the hub lists them.
#[derive(Debug, Clone)]
pub struct FileHashes {
    /// sha256 of the content (the LFS oid).
    pub sha256: String,
    /// The git blob sha1 the tree lists: of the content for small files, of the LFS pointer
    /// for LFS files.
    pub git_oid: String,
    /// Size of the LFS pointer file.
    pub pointer_size: u64,
}

/// Computes (or reads from `cache_dir`) the hashes of one file.
pub fn hashes(repo: &str, f: &FileSpec, cache_dir: Option<&Path>) -> FileHashes {
    let sha256 = content_sha256(repo, f, cache_dir);
    if f.lfs {
        let pointer = format!(
            "version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {}\n",
            f.size
        );
        FileHashes {
            git_oid: git_blob_sha1(pointer.as_bytes()),
            pointer_size: pointer.len() as u64,
            sha256,
        }
    } else {
        FileHashes {
            git_oid: match f.literal() {
                Some(b) => git_blob_sha1(b),
                None => git_blob_sha1(&bytes(repo, &f.path, f.size)),
            },
            pointer_size: 0,
            sha256,
        }
    }
}

/// git's blob id: sha1 of `blob <len>\0` and the content.
pub fn git_blob_sha1(content: &[u8]) -> String {
    let mut h = Sha1::new();
    h.update(format!("blob {}\0", content.len()).as_bytes());
    h.update(content);
    hex::encode(h.finalize())
}

fn cache_file(dir: &Path, repo: &str, f: &FileSpec) -> PathBuf {
    let key = Sha256::digest(format!(
        "{GENERATOR_VERSION}\0{repo}\0{}\0{}",
        f.path, f.size
    ));
    dir.join(format!("{}.sha256", hex::encode(&key[..16])))
}

fn content_sha256(repo: &str, f: &FileSpec, cache_dir: Option<&Path>) -> String {
    if let Some(b) = f.literal() {
        return hex::encode(Sha256::digest(b));
    }
    // Files below 64 MiB hash faster than a cache lookup is worth keeping around.
    let cached = cache_dir.filter(|_| f.size >= 64 << 20);
    if let Some(dir) = cached
        && let Ok(text) = std::fs::read_to_string(cache_file(dir, repo, f))
        && text.trim().len() == 64
    {
        return text.trim().to_string();
    }
    let seed = seed(repo, &f.path);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < f.size {
        let n = (f.size - off).min(buf.len() as u64) as usize;
        fill(seed, off, &mut buf[..n]);
        h.update(&buf[..n]);
        off += n as u64;
    }
    let hex = hex::encode(h.finalize());
    if let Some(dir) = cached {
        // A cache that cannot be written only costs time next start.
        let _ = std::fs::create_dir_all(dir);
        let path = cache_file(dir, repo, f);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &hex).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_is_random_access() {
        let s = seed("a/b", "x.bin");
        let mut whole = vec![0u8; 100];
        fill(s, 0, &mut whole);
        for start in 0..20 {
            let mut part = vec![0u8; 37];
            fill(s, start as u64, &mut part);
            assert_eq!(part, whole[start..start + 37]);
        }
    }

    #[test]
    fn git_blob_sha1_matches_git() {
        // `printf 'hello\n' | git hash-object --stdin`
        assert_eq!(
            git_blob_sha1(b"hello\n"),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
    }
}
