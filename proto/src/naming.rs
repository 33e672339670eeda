//! Plugin identity rules (NRI `pkg/api/plugin.go`).
//!
//! A plugin is known by its two-digit *index* and its *name*; together they
//! form the qualified name `IDX-NAME` used in ownership records, errors and
//! logs. Pre-installed plugins take both from their file name.

/// Why a plugin index, name or file name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamingError {
    /// The index is not exactly two ASCII digits.
    #[error("invalid plugin index {0:?}: must be two digits [0-9][0-9]")]
    InvalidIndex(String),
    /// The name is empty.
    #[error("invalid plugin name: empty")]
    EmptyName,
    /// The name holds a character outside `[a-zA-Z0-9_.+-]`.
    #[error("invalid plugin name {name:?}: character {ch:?} not allowed (use [a-zA-Z0-9_.+-])")]
    InvalidNameChar {
        /// The refused name.
        name: String,
        /// The first offending character.
        ch: char,
    },
    /// A file name not of the form `IDX-NAME`.
    #[error("invalid plugin file name {0:?}: expected IDX-NAME with a two-digit IDX")]
    InvalidFileName(String),
}

/// Checks a plugin index: exactly two ASCII digits.
///
/// ```
/// assert!(nri_proto::naming::check_index("05").is_ok());
/// assert!(nri_proto::naming::check_index("5").is_err());
/// ```
pub fn check_index(idx: &str) -> Result<(), NamingError> {
    let b = idx.as_bytes();
    if b.len() == 2 && b.iter().all(u8::is_ascii_digit) {
        Ok(())
    } else {
        Err(NamingError::InvalidIndex(idx.to_string()))
    }
}

/// Checks an external plugin's name: non-empty, only `[a-zA-Z0-9_.+-]`.
///
/// ```
/// assert!(nri_proto::naming::check_name("abcd-0123+EFGH_4567.ijkl").is_ok());
/// assert!(nri_proto::naming::check_name("foo,bar").is_err());
/// ```
pub fn check_name(name: &str) -> Result<(), NamingError> {
    if name.is_empty() {
        return Err(NamingError::EmptyName);
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '+' | '-')))
    {
        Some(ch) => Err(NamingError::InvalidNameChar {
            name: name.to_string(),
            ch,
        }),
        None => Ok(()),
    }
}

/// Splits a pre-installed plugin's file name `IDX-NAME` at the first `-`.
///
/// Returns `(index, name)`. The name itself is not checked against the
/// character set (upstream does not either); it must be non-empty.
///
/// ```
/// use nri_proto::naming::parse_plugin_file_name;
/// assert_eq!(parse_plugin_file_name("10-logger").unwrap(), ("10".into(), "logger".into()));
/// assert!(parse_plugin_file_name("logger").is_err());
/// ```
pub fn parse_plugin_file_name(file_name: &str) -> Result<(String, String), NamingError> {
    let (idx, name) = file_name
        .split_once('-')
        .ok_or_else(|| NamingError::InvalidFileName(file_name.to_string()))?;
    if check_index(idx).is_err() || name.is_empty() {
        return Err(NamingError::InvalidFileName(file_name.to_string()));
    }
    Ok((idx.to_string(), name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_rules() {
        for ok in ["00", "10", "99"] {
            assert!(check_index(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1", "100", "a1", "1a", "-1", "１２"] {
            assert_eq!(check_index(bad), Err(NamingError::InvalidIndex(bad.into())), "{bad}");
        }
    }

    #[test]
    fn name_rules() {
        assert!(check_name("abcd-0123+EFGH_4567.ijkl").is_ok());
        assert_eq!(check_name(""), Err(NamingError::EmptyName));
        assert_eq!(
            check_name("foo,bar"),
            Err(NamingError::InvalidNameChar {
                name: "foo,bar".into(),
                ch: ','
            })
        );
        assert!(check_name("a b").is_err());
        assert!(check_name("a/b").is_err());
    }

    #[test]
    fn file_names() {
        assert_eq!(
            parse_plugin_file_name("05-logger-extra").unwrap(),
            ("05".into(), "logger-extra".into())
        );
        for bad in ["logger", "5-logger", "105-logger", "10-", "-10", "ab-x"] {
            assert!(parse_plugin_file_name(bad).is_err(), "{bad}");
        }
    }
}
