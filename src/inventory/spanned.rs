//! [`Sp<T>`]: a value that remembers where in the inventory it was written.

use std::borrow::Cow;
use std::fmt;
use std::ops::Deref;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A 1-based line and column in the inventory file; `0:0` when unknown (values that came
/// from defaults rather than from the file). Serialized as `"line:column"` (a saved plan
/// keeps where the inventory declared what it applies).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    PartialOrd,
    Ord,
    serde_with::SerializeDisplay,
    serde_with::DeserializeFromStr,
)]
pub struct Pos {
    /// 1-based line, 0 when unknown.
    pub line: u32,
    /// 1-based column, 0 when unknown.
    pub column: u32,
}

impl Pos {
    /// Whether this position points into the file.
    pub fn is_known(&self) -> bool {
        self.line > 0
    }
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// Text that is not a position: `line:column`, two whole numbers.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a position (line:column)")]
pub struct BadPos(String);

impl std::str::FromStr for Pos {
    type Err = BadPos;

    fn from_str(s: &str) -> Result<Self, BadPos> {
        let bad = || BadPos(s.to_string());
        let (line, column) = s.split_once(':').ok_or_else(bad)?;
        Ok(Pos {
            line: line.parse().map_err(|_| bad())?,
            column: column.parse().map_err(|_| bad())?,
        })
    }
}

/// A value with the position it was read from. Serializes, compares and documents itself
/// exactly as the bare value does.
#[derive(Clone)]
pub struct Sp<T> {
    /// The value.
    pub value: T,
    /// Where it was written.
    pub pos: Pos,
}

impl<T> Sp<T> {
    /// A value that did not come from the file (a default).
    pub fn new(value: T) -> Self {
        Sp {
            value,
            pos: Pos::default(),
        }
    }

    /// A value with a known position.
    pub fn at(value: T, pos: Pos) -> Self {
        Sp { value, pos }
    }
}

impl<T> Deref for Sp<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: fmt::Debug> fmt::Debug for Sp<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
    }
}

impl<T: fmt::Display> fmt::Display for Sp<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
    }
}

impl<T: PartialEq> PartialEq for Sp<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl<T: Eq> Eq for Sp<T> {}

impl<T: std::hash::Hash> std::hash::Hash for Sp<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.value.hash(state)
    }
}

impl<T: Default> Default for Sp<T> {
    fn default() -> Self {
        Sp::new(T::default())
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Sp<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spanned = serde_saphyr::Spanned::<T>::deserialize(deserializer)?;
        let loc = spanned.referenced;
        Ok(Sp {
            value: spanned.value,
            pos: Pos {
                line: u32::try_from(loc.line()).unwrap_or(u32::MAX),
                column: u32::try_from(loc.column()).unwrap_or(u32::MAX),
            },
        })
    }
}

impl<T: Serialize> Serialize for Sp<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(serializer)
    }
}

impl<T: JsonSchema> JsonSchema for Sp<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }

    fn schema_name() -> Cow<'static, str> {
        T::schema_name()
    }

    fn schema_id() -> Cow<'static, str> {
        T::schema_id()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        T::json_schema(generator)
    }
}
