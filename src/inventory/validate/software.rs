//! What a container installs: Debian packages, APT sources, the ml-env and models.

use std::collections::{HashMap, HashSet};

use super::Validator;
use crate::inventory::Pos;
use crate::inventory::apt::AptRepository;
use crate::inventory::apt::nvidia_distribution;
use crate::inventory::container::Container;
use crate::inventory::text::Name;
use crate::openpgp;

impl Validator<'_> {
    /// A keyed repository: suites, and a key pinned by a whole fingerprint, unless the
    /// user wrote `trusted: true`.
    fn apt_repository(&mut self, repo: &AptRepository, at: Pos) {
        if repo.suites.is_empty() {
            self.err(
                repo.uri.pos,
                "an APT repository needs `suites`",
                "a flat repository (NVIDIA's) has `suites: [\"/\"]`; others name theirs, e.g. `[bookworm]` with `components: [main]`",
            );
        }
        match &repo.key {
            None if !repo.trusted.value => self.err(
                at,
                format!("APT repository {} has no signing key", repo.uri.value),
                "add `key: { url: ..., fingerprint: ... }` (or `file:`) with the key's full fingerprint; `trusted: true` skips signatures and is yours to write",
            ),
            None => {}
            Some(k) => {
                if k.url.is_some() == k.file.is_some() {
                    self.err(
                        k.fingerprint.pos,
                        "a key has exactly one of `url` and `file`",
                        "`url:` the target fetches it from; `file:` a key file beside the inventory",
                    );
                }
                let fpr = openpgp::normalize(k.fingerprint.as_str());
                if !matches!(fpr.len(), 40 | 64) || !fpr.chars().all(|c| c.is_ascii_hexdigit()) {
                    self.err(
                        k.fingerprint.pos,
                        format!("`{}` is not a whole key fingerprint", k.fingerprint.value),
                        "write all 40 hex digits, as `gpg --show-keys --with-colons KEYFILE` prints them on the `fpr` line (a short key ID is not a pin)",
                    );
                }
            }
        }
    }

    pub(super) fn software(&mut self, ct: &Container) {
        for p in &ct.packages {
            let (name, version) = match p.as_str().split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (p.as_str(), None),
            };
            let name_ok = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && name.len() > 1
                && name.chars().all(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '+' | '-' | '.')
                });
            let version_ok = version.is_none_or(|v| {
                !v.is_empty()
                    && v.chars().all(|c| {
                        c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '~' | ':' | '-')
                    })
            });
            if !name_ok || !version_ok {
                self.err(
                    p.pos,
                    format!("`{}` is not a Debian package", p.value),
                    "write `name` or `name=version`, e.g. `htop` or `git=1:2.39.5-0+deb12u2`",
                );
            }
        }
        let mut source_names = HashSet::new();
        for s in &ct.apt_sources {
            if !source_names.insert(s.name.as_str()) {
                self.err(
                    s.name.pos,
                    format!("APT source `{}` is declared twice", s.name.value),
                    "give each source its own name",
                );
            }
            match (&s.line, s.repository()) {
                (Some(line), None) => {
                    let text = line.as_str();
                    if !(text.starts_with("deb ") || text.starts_with("deb-src ")) {
                        self.err(
                            line.pos,
                            format!("`{text}` is not a one-line APT source"),
                            "write `deb [options] URI SUITE [COMPONENT...]`",
                        );
                    }
                }
                (None, Some(repo)) => self.apt_repository(&repo, s.name.pos),
                (Some(line), Some(_)) => self.err(
                    line.pos,
                    format!("APT source `{}` has both `line` and `uri`", s.name.value),
                    "write either the one-line `line:` or `uri:`/`suites:`/`key:`",
                ),
                (None, None) => self.err(
                    s.name.pos,
                    format!("APT source `{}` has no `uri`", s.name.value),
                    "write `uri:`, `suites:` and `key: { url: ..., fingerprint: ... }` (or a one-line `line:`)",
                ),
            }
        }
        if let Some(cuda) = &ct.cuda {
            match &cuda.repository {
                Some(repo) => self.apt_repository(repo, cuda.version.pos),
                None if nvidia_distribution(ct.template.as_str()).is_none() => self.err(
                    ct.template.pos,
                    format!(
                        "cannot tell which of NVIDIA's CUDA repositories fits template `{}`",
                        ct.template.value
                    ),
                    "set `cuda.repository` (uri, suites, key with its fingerprint): NVIDIA's for your distribution or a local mirror",
                ),
                None => {}
            }
        }
        if let Some(env) = &ct.ml_env {
            if let Some(src) = &env.sglang {
                let rev = src.revision.as_str();
                if rev.len() != 40 || !rev.chars().all(|c| c.is_ascii_hexdigit()) {
                    self.err(
                        src.revision.pos,
                        format!("`{rev}` is not a pinned commit"),
                        "write the full 40-hex commit (`git rev-parse HEAD`), so every rebuild gets the same code",
                    );
                }
                if src.path.starts_with(&env.path) {
                    self.err(
                        src.path.pos,
                        "the SGLang checkout is inside the venv",
                        "keep the checkout beside the venv, e.g. `/root/sglang-main`",
                    );
                }
            }
            let mut seen = HashMap::new();
            for p in &env.packages {
                if let Some(first) = seen.insert(p.normalized_name(), p) {
                    self.err(
                        p.pos,
                        format!("`{}` is pinned twice (also `{}`)", p.value, first.value),
                        "keep one pin per package",
                    );
                }
            }
            if let Some(idx) = &env.index
                && let (Some(url), Some(_)) = (&idx.url, &idx.wheelhouse)
            {
                self.err(
                    url.pos,
                    "both an index URL and a wheelhouse are set",
                    "a wheelhouse means no index (air-gapped): keep one",
                );
            }
        }
        for (name, model) in &ct.models {
            let repo = model.repo.as_str();
            let ok = repo.split_once('/').is_some_and(|(org, n)| {
                let part = |s: &str| {
                    !s.is_empty()
                        && s.chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                };
                part(org) && part(n)
            });
            if !ok {
                self.err(
                    model.repo.pos,
                    format!("`{repo}` is not a Hugging Face repository"),
                    "write ORG/NAME, e.g. `Qwen/Qwen3.5-122B-A10B`",
                );
            }
            for g in model.include.iter().chain(&model.exclude) {
                if let Err(e) = globset::Glob::new(g.as_str()) {
                    self.err(
                        g.pos,
                        format!("`{}` is not a glob: {}", g.value, e.kind()),
                        "use *, ? and [..], e.g. `*.safetensors`",
                    );
                }
            }
            let under = ct.mounts.iter().any(|m| model.path.starts_with(&m.path));
            if !under {
                let mounts: Vec<&str> = ct.mounts.iter().map(|m| m.path.as_str()).collect();
                let hint = if mounts.is_empty() {
                    "models belong on shared storage that survives the container: add a mount (e.g. a host dataset at `/shared`) and put the model under it".to_string()
                } else {
                    format!(
                        "put it under a mount ({}), so it survives rebuilding the container",
                        mounts.join(", ")
                    )
                };
                self.err(
                    model.path.pos,
                    format!(
                        "model `{name}` at `{}` is outside every mount",
                        model.path.value
                    ),
                    hint,
                );
            }
        }
        let mut paths: HashMap<&str, &Name> = HashMap::new();
        for (name, model) in &ct.models {
            if let Some(other) = paths.insert(model.path.as_str(), name) {
                self.err(
                    model.path.pos,
                    format!(
                        "models `{other}` and `{name}` share the path `{}`",
                        model.path.value
                    ),
                    "give each model its own folder",
                );
            }
        }
    }
}
