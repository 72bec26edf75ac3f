//! Enums a knob names by a fixed set of words: each variant's word is declared once, and the
//! knob table's rule, the parser, `Display` and serde all read it from there.

/// Declares an enum whose variants are spelled by the given words, with `WORDS` (for the knob
/// table's `Rule::OneOf`), `as_str`, `FromStr`, `Display`, `Serialize` and `Deserialize`.
macro_rules! choice {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $word:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant ),+
        }

        impl $name {
            /// Every spelling, in declaration order.
            pub const WORDS: &'static [&'static str] = &[$($word),+];
            /// Every variant, in the order of `WORDS`.
            pub const ALL: [$name; [$($word),+].len()] = [$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $word ),+
                }
            }
        }

        impl $crate::choice::Choice for $name {
            fn first() -> Self {
                Self::ALL[0]
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::choice::UnknownWord;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::ALL
                    .into_iter()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| $crate::choice::UnknownWord::new(s, Self::WORDS))
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <::std::borrow::Cow<'de, str> as ::serde::Deserialize>::deserialize(d)?;
                s.parse().map_err(::serde::de::Error::custom)
            }
        }
    };
}

pub(crate) use choice;

/// What the builder needs of a `choice!` enum: parsing, and a stand-in for a refused value.
pub(crate) trait Choice: std::str::FromStr + Copy {
    fn first() -> Self;
}

/// A word that names none of an enum's variants.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{word}` is not one of: {}", .allowed.join(", "))]
pub struct UnknownWord {
    pub word: String,
    pub allowed: &'static [&'static str],
}

impl UnknownWord {
    pub(crate) fn new(word: &str, allowed: &'static [&'static str]) -> Self {
        Self {
            word: word.to_owned(),
            allowed,
        }
    }
}

#[cfg(test)]
#[allow(unreachable_pub)]
mod tests {
    choice! {
        /// A test enum.
        enum Colour { Red = "red", DarkBlue = "dark-blue" }
    }

    #[test]
    fn words_parse_print_and_round_trip_through_serde() {
        assert_eq!(Colour::WORDS, ["red", "dark-blue"]);
        assert_eq!("dark-blue".parse::<Colour>(), Ok(Colour::DarkBlue));
        assert_eq!(Colour::Red.to_string(), "red");
        let err = "blue".parse::<Colour>().unwrap_err();
        assert_eq!(err.to_string(), "`blue` is not one of: red, dark-blue");
        assert_eq!(serde_json::to_string(&Colour::DarkBlue).unwrap(), "\"dark-blue\"");
        assert_eq!(serde_json::from_str::<Colour>("\"red\"").unwrap(), Colour::Red);
        assert!(serde_json::from_str::<Colour>("\"green\"").is_err());
    }
}
