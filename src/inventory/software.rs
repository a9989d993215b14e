//! Software inside a container: the CUDA toolkit, the Python environment with SGLang, and
//! the models it serves.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::secret::SecretRef;
use super::spanned::Sp;
use super::text::{AbsPath, Name, Text, ValueError};

/// A version written `MAJOR.MINOR` (`"13.0"`, `"3.12"`). It must be quoted in YAML:
/// unquoted, `3.10` would read as the number 3.1.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Version {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl Version {
    /// Parses `13.0`.
    pub fn parse(s: &str) -> Result<Self, ValueError> {
        let (a, b) = s.split_once('.').ok_or_else(|| {
            ValueError::new(format!("`{s}` is not a MAJOR.MINOR version"))
                .hint("write e.g. \"13.0\"")
        })?;
        match (a.parse(), b.parse()) {
            (Ok(major), Ok(minor)) if !b.contains('.') => Ok(Version { major, minor }),
            _ => Err(
                ValueError::new(format!("`{s}` is not a MAJOR.MINOR version"))
                    .hint("write e.g. \"13.0\""),
            ),
        }
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Version;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a quoted MAJOR.MINOR version such as \"13.0\"")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Version, E> {
                Version::parse(s).map_err(E::custom)
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Version, E> {
                Err(E::custom(
                    ValueError::new(format!(
                        "this version was read as the number {v}, which loses trailing zeros"
                    ))
                    .hint(format!("quote it: \"{v}\"")),
                ))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Version, E> {
                Err(E::custom(
                    ValueError::new(format!("`{v}` is not a MAJOR.MINOR version"))
                        .hint(format!("write it quoted with a minor part, e.g. \"{v}.0\"")),
                ))
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for Version {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl JsonSchema for Version {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("Version")
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "pattern": "^[0-9]+\\.[0-9]+$", "description": "MAJOR.MINOR, quoted (e.g. \"13.0\")."})
    }
}

/// The CUDA toolkit.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Cuda {
    /// Toolkit release, quoted: `"13.0"`.
    pub version: Sp<Version>,
    /// Where it is installed; defaults to `/usr/local/cuda-<version>`.
    pub home: Option<Sp<AbsPath>>,
    /// The Debian package that installs it; defaults to `cuda-toolkit-<major>-<minor>`
    /// from NVIDIA's repository.
    pub package: Option<Sp<Name>>,
    /// The APT repository the package comes from; defaults to NVIDIA's for the
    /// container's distribution (from its template's name), keyed by NVIDIA's signing key.
    /// Set it for a local mirror.
    pub repository: Option<super::apt::AptRepository>,
}

impl Cuda {
    /// The toolkit's home.
    pub fn home(&self) -> AbsPath {
        match &self.home {
            Some(h) => h.value.clone(),
            None => AbsPath::parse(&format!("/usr/local/cuda-{}", self.version.value))
                .expect("a version makes a valid path"),
        }
    }

    /// The package that provides it.
    pub fn package(&self) -> String {
        match &self.package {
            Some(p) => p.to_string(),
            None => format!("cuda-toolkit-{}-{}", self.version.major, self.version.minor),
        }
    }
}

/// A Python package pinned to one version: `name==version` (extras allowed:
/// `sglang[all]==0.5.10`).
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, serde_with::DeserializeFromStr, serde_with::SerializeDisplay,
)]
pub struct Pinned {
    /// The name as written (with extras).
    pub name: String,
    /// The exact version.
    pub version: String,
}

impl Pinned {
    /// The name normalised as PEP 503 does (lower case, runs of `-_.` as `-`), without
    /// extras: the key to compare with what is installed.
    pub fn normalized_name(&self) -> String {
        normalize_package_name(self.name.split('[').next().unwrap_or(""))
    }
}

/// PEP 503 name normalisation.
pub fn normalize_package_name(name: &str) -> String {
    let mut out = String::new();
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('-');
            }
            sep = false;
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// Why a text is not a PEP 508 requirement, in the parser's words.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Pep508Error(pub String);

/// Parses a PEP 508 requirement. pep508_rs 0.9.2 panics (an `expect` in its `parse_name`)
/// on a name that ends in `.`, `-` or `_` when more text follows (`torc9.==1`, found by
/// fuzzing the inventory): such a name is refused before the parser sees it.
pub fn parse_pep508(
    text: &str,
) -> Result<pep508_rs::Requirement<pep508_rs::VerbatimUrl>, Pep508Error> {
    let name: String = text
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        .collect();
    if let Some(last) = name.chars().last().filter(|c| !c.is_ascii_alphanumeric()) {
        return Err(Pep508Error(format!(
            "package name `{name}` must end with a letter or digit, not `{last}`"
        )));
    }
    pep508_rs::Requirement::from_str(text).map_err(|e| Pep508Error(e.message.to_string()))
}

impl fmt::Display for Pinned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}=={}", self.name, self.version)
    }
}

impl FromStr for Pinned {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        let bad = |why: &str| {
            ValueError::new(format!("`{s}` {why}")).hint(
                "pin an exact version, e.g. `torch==2.9.1`, so the environment is reproducible",
            )
        };
        let (name, version) = s.split_once("==").ok_or_else(|| bad("is not pinned"))?;
        let name_ok = !name.is_empty()
            && name.chars().all(|c| {
                c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '[' | ']' | ',')
            });
        let version_ok = !version.is_empty()
            && version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '!' | '-' | '_'));
        if !name_ok || !version_ok {
            return Err(bad("is not a pinned requirement"));
        }
        // The pip resource reads it as PEP 508: refuse here, at the inventory's line, what
        // it would refuse later at the role's (found by fuzzing: `numpy==2.q.3`).
        if let Err(e) = parse_pep508(s) {
            return Err(bad(&format!("is not a PEP 508 requirement: {e}")));
        }
        Ok(Pinned {
            name: name.to_string(),
            version: version.to_string(),
        })
    }
}

impl JsonSchema for Pinned {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("Pinned")
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "pattern": "^[A-Za-z0-9._\\[\\],-]+==[A-Za-z0-9.+!_-]+$", "description": "A pinned requirement: name==version."})
    }
}

/// The Python virtual environment SGLang runs from.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MlEnv {
    /// The venv's folder, e.g. `/root/ml-env`.
    pub path: Sp<AbsPath>,
    /// Python release, quoted: `"3.12"`.
    pub python: Sp<Version>,
    /// Packages, each pinned to one version.
    #[serde(default)]
    pub packages: Vec<Sp<Pinned>>,
    /// Where packages come from; PyPI when unset.
    pub index: Option<PackageIndex>,
    /// What builds the venv and installs into it: `uv` (pushed from the workstation,
    /// pinned by version and sha256) or `pip` (`python -m venv`, then pip). When unset,
    /// uv, whatever the workstation has cached: every workstation plans the same.
    pub installer: Option<Sp<Installer>>,
    /// SGLang built from a git checkout.
    pub sglang: Option<SglangSource>,
    /// Modules imported in the venv once everything is installed (e.g. `torch.cuda`,
    /// `sgl_kernel`, `sglang.srt.server_args`), with a C helper compiled against
    /// `Python.h` as Triton compiles one at its first kernel launch: a kernel built for
    /// another CUDA, a missing library or a missing compiler fails here, naming it, before
    /// the model download and the service.
    #[serde(default)]
    pub imports: Vec<Sp<Text>>,
    /// Debian packages the stack needs at run time (Triton and FlashInfer compile with a
    /// C compiler against `Python.h`); `[build-essential, python<X.Y>-dev, libnuma1]`
    /// when not written.
    pub runtime_packages: Option<Vec<Sp<Name>>>,
}

impl MlEnv {
    /// The venv's `bin` folder.
    pub fn bin(&self) -> AbsPath {
        self.path.join("bin")
    }

    /// The installer used: as written, else uv. Nothing on the workstation decides it (the
    /// pinned wheel is fetched at apply when its cache lacks it), so two workstations plan
    /// the same installer and the same generation.
    pub fn installer(&self) -> Installer {
        self.installer.as_ref().map_or(Installer::Uv, |i| i.value)
    }
}

/// What builds the ml-env.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Installer {
    /// uv: the venv and every install, pushed to the target as one static binary.
    Uv,
    /// `python -m venv` and the venv's own pip.
    Pip,
}

/// A package index or a local wheelhouse (air-gapped hosts).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PackageIndex {
    /// The main index URL (`pip --index-url`).
    pub url: Option<Sp<Text>>,
    /// More index URLs (`pip --extra-index-url`), e.g. PyTorch's CUDA wheels.
    #[serde(default)]
    pub extra_urls: Vec<Sp<Text>>,
    /// A folder of wheels on the target (`pip --no-index --find-links`).
    pub wheelhouse: Option<Sp<AbsPath>>,
    /// More places pip looks for wheels (`pip --find-links`): a URL of a page of links or
    /// a folder on the target, e.g. SGLang's CUDA 13 kernel wheels
    /// `https://sgl-project.github.io/whl/cu130/sglang-kernel/`; pin the build you want from
    /// there in `packages` (`sglang-kernel==0.4.1+cu130`).
    #[serde(default)]
    pub find_links: Vec<Sp<Text>>,
}

/// SGLang from a git checkout, installed editable into the venv.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SglangSource {
    /// Repository URL.
    pub repo: Sp<Text>,
    /// The commit to check out: 40 hex digits, so every rebuild gets the same code.
    pub revision: Sp<Text>,
    /// The checkout's folder, e.g. `/root/sglang-main`.
    pub path: Sp<AbsPath>,
    /// The folder inside the checkout that `pip install -e` takes.
    #[serde(default = "default_python_subdir")]
    pub subdirectory: Sp<Text>,
    /// Extras to install, e.g. `[all]`.
    #[serde(default)]
    pub extras: Vec<Sp<Name>>,
}

fn default_python_subdir() -> Sp<Text> {
    Sp::new(Text::parse("python").expect("valid default"))
}

/// A model from the Hugging Face Hub.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HfModel {
    /// Repository, `org/name`.
    pub repo: Sp<Text>,
    /// Branch, tag or commit; resolved to a commit when planning.
    #[serde(default = "default_revision")]
    pub revision: Sp<Text>,
    /// Only files matching one of these globs (all files when empty).
    #[serde(default)]
    pub include: Vec<Sp<Text>>,
    /// Leave out files matching these globs.
    #[serde(default)]
    pub exclude: Vec<Sp<Text>>,
    /// Where the files go, inside a mount, e.g. `/shared/models/Qwen3.5-122B-A10B`.
    pub path: Sp<AbsPath>,
    /// A token for gated repositories, by reference.
    pub token: Option<Sp<SecretRef>>,
    /// The hub's URL (a mirror); `https://huggingface.co` when unset.
    pub endpoint: Option<Sp<Text>>,
    /// `present` (the default) or `absent`: the folder is deleted (as `--prune-models`
    /// deletes an undeclared one, for this model alone), shown in `plan` with its size.
    #[serde(default)]
    pub state: Sp<ModelState>,
}

impl HfModel {
    /// Whether the model is declared `state: absent`.
    pub fn absent(&self) -> bool {
        self.state.value == ModelState::Absent
    }
}

/// Whether a model's folder is to be there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ModelState {
    /// Downloaded and verified.
    #[default]
    Present,
    /// Deleted, with everything in its folder.
    Absent,
}

fn default_revision() -> Sp<Text> {
    Sp::new(Text::parse("main").expect("valid default"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_pep503() {
        assert_eq!(Version::parse("13.0").unwrap().to_string(), "13.0");
        assert!(Version::parse("13").is_err());
        assert!(Version::parse("1.2.3").is_err());
        assert_eq!(normalize_package_name("Flash_Attn.X"), "flash-attn-x");
        let p: Pinned = serde_json::from_str("\"sglang[all]==0.5.10\"").unwrap();
        assert_eq!(p.normalized_name(), "sglang");
        assert!(serde_json::from_str::<Pinned>("\"torch>=2\"").is_err());
        let e = serde_json::from_str::<Pinned>("\"numpy==2.q.3\"").unwrap_err();
        assert!(e.to_string().contains("not a PEP 508 requirement"), "{e}");
        // pep508_rs panics on these unless they are refused first (found by fuzzing).
        for text in ["torc9.==1.0", "a-==1", "b_[x]==2", "c. ==3"] {
            let e = parse_pep508(text).unwrap_err();
            assert!(
                e.to_string().contains("must end with a letter or digit"),
                "{e}"
            );
        }
        assert!(parse_pep508("flash_attn.x==2.8.3").is_ok());
    }
}
