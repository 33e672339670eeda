//! Name patterns of a rule's `[match]`: an exact string, or a simple glob
//! where `*` stands for any run of characters (also none).

use std::fmt;

/// Why a pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// The empty string matches no pod or container name.
    #[error("empty pattern")]
    Empty,
    /// A glob character other than `*` (`?`, `[`, `]`, `{`, `}`, `\`): not
    /// supported, refused so that nobody relies on it.
    #[error("invalid glob {pattern:?}: {ch:?} is not supported, only * is")]
    Unsupported {
        /// The pattern.
        pattern: String,
        /// The first unsupported character.
        ch: char,
    },
}

/// A compiled name pattern.
///
/// ```
/// use nri_adjuster::Pattern;
/// let p: Pattern = "web-*".parse().unwrap();
/// assert!(p.matches("web-1") && p.matches("web-") && !p.matches("api-1"));
/// assert!("app".parse::<Pattern>().unwrap().matches("app"));
/// assert!("a?c".parse::<Pattern>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub struct Pattern {
    raw: String,
    /// The literal parts between the `*`s (one part: an exact match).
    parts: Vec<String>,
}

impl Pattern {
    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// Whether the pattern has a `*`.
    pub fn is_glob(&self) -> bool {
        self.parts.len() > 1
    }

    /// Whether `s` matches: equal for an exact pattern; for a glob, `s`
    /// starts with the first part, ends with the last, and holds the
    /// others in order in between, without overlaps.
    pub fn matches(&self, s: &str) -> bool {
        let (first, rest) = match self.parts.split_first() {
            Some(x) => x,
            None => return false,
        };
        let Some((last, middle)) = rest.split_last() else {
            return s == first;
        };
        let Some(mut tail) = s.strip_prefix(first.as_str()) else {
            return false;
        };
        for part in middle {
            match tail.find(part.as_str()) {
                Some(at) => tail = &tail[at + part.len()..],
                None => return false,
            }
        }
        tail.len() >= last.len() && tail.ends_with(last.as_str())
    }
}

impl TryFrom<String> for Pattern {
    type Error = PatternError;

    fn try_from(raw: String) -> Result<Self, Self::Error> {
        if raw.is_empty() {
            return Err(PatternError::Empty);
        }
        if let Some(ch) = raw.chars().find(|c| matches!(c, '?' | '[' | ']' | '{' | '}' | '\\')) {
            return Err(PatternError::Unsupported { pattern: raw, ch });
        }
        let parts = raw.split('*').map(str::to_string).collect();
        Ok(Pattern { raw, parts })
    }
}

impl std::str::FromStr for Pattern {
    type Err = PatternError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Pattern::try_from(s.to_string())
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, s: &str) -> bool {
        p.parse::<Pattern>().unwrap().matches(s)
    }

    #[test]
    fn exact_and_glob_matching() {
        assert!(m("app", "app"));
        assert!(!m("app", "app2"));
        assert!(!m("app", "ap"));
        assert!(m("*", ""));
        assert!(m("*", "anything"));
        assert!(m("app*", "app"));
        assert!(m("app*", "app-1"));
        assert!(!m("app*", "xapp"));
        assert!(m("*-app", "web-app"));
        assert!(!m("*-app", "web-ap"));
        assert!(m("a*b*c", "abc"));
        assert!(m("a*b*c", "axxbyyc"));
        assert!(!m("a*b*c", "axxcyyb"));
        assert!(m("**", "x"));
        // The suffix must not overlap the prefix.
        assert!(!m("ab*ba", "aba"));
        assert!(m("ab*ba", "abba"));
        assert!(!m("a*bc*bc", "abc"));
    }

    #[test]
    fn bad_patterns_are_refused() {
        assert_eq!("".parse::<Pattern>().unwrap_err(), PatternError::Empty);
        for bad in ["a?", "[ab]", "{a,b}", "a\\*"] {
            let e = bad.parse::<Pattern>().unwrap_err().to_string();
            assert!(e.contains("only * is"), "{bad}: {e}");
        }
    }
}
