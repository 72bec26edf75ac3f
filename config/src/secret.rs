//! `Secret`: a string that cannot be printed by accident.

use std::fmt;

/// A secret value (token, API key). `Debug` and `Display` print a redaction marker; the value is
/// reachable only through [`Secret::expose`], so every use of the plain text is greppable.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

/// What every printed secret looks like.
pub const REDACTED: &str = "<redacted>";

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The plain text. Call only where the value must leave the process (an HTTP header, a
    /// container environment handed to Docker), never for logs or status output.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl serde::Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(REDACTED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rendering_is_redacted() {
        let s = Secret::new("hf_abcdef");
        assert_eq!(format!("{s}"), REDACTED);
        assert_eq!(format!("{s:?}"), REDACTED);
        assert_eq!(format!("{:?}", Some(&s)), format!("Some({REDACTED})"));
        assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{REDACTED}\""));
        assert_eq!(s.expose(), "hf_abcdef");
    }
}
