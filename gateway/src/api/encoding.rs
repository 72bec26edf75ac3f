//! A request body's text as vLLM reads it: FastAPI hands the bytes to Python's `json.loads`,
//! which detects UTF-8 with or without a byte-order mark, UTF-16 and UTF-32 (`json.detect_encoding`).
//! The gateway parses the same text, so a body vLLM accepts is never refused for its encoding.

use std::borrow::Cow;

use crate::api::error::GatewayError;

/// The encodings `json.detect_encoding` tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Utf8,
    /// UTF-8 after a byte-order mark (`utf-8-sig`).
    Utf8Bom,
    /// UTF-16 or UTF-32 after a byte-order mark that tells the byte order.
    Utf16Bom,
    Utf32Bom,
    Utf16 {
        big: bool,
    },
    Utf32 {
        big: bool,
    },
}

/// Python's `json.detect_encoding` (Lib/json/__init__.py), rule for rule.
fn detect(b: &[u8]) -> Encoding {
    const BOM_UTF32_BE: &[u8] = &[0, 0, 0xfe, 0xff];
    const BOM_UTF32_LE: &[u8] = &[0xff, 0xfe, 0, 0];
    if b.starts_with(BOM_UTF32_BE) || b.starts_with(BOM_UTF32_LE) {
        return Encoding::Utf32Bom;
    }
    if b.starts_with(&[0xfe, 0xff]) || b.starts_with(&[0xff, 0xfe]) {
        return Encoding::Utf16Bom;
    }
    if b.starts_with(&[0xef, 0xbb, 0xbf]) {
        return Encoding::Utf8Bom;
    }
    match b {
        [0, b1, ..] if b.len() >= 4 => match b1 {
            0 => Encoding::Utf32 { big: true },
            _ => Encoding::Utf16 { big: true },
        },
        [_, 0, b2, b3, ..] => match (b2, b3) {
            (0, 0) => Encoding::Utf32 { big: false },
            _ => Encoding::Utf16 { big: false },
        },
        [0, _] => Encoding::Utf16 { big: true },
        [_, 0] => Encoding::Utf16 { big: false },
        _ => Encoding::Utf8,
    }
}

/// The body as UTF-8 JSON text: the same bytes for UTF-8 (past a byte-order mark), decoded
/// anew for UTF-16 and UTF-32. Bytes that do not decode are refused, as Python's decoder does.
pub(crate) fn json_text(bytes: &[u8]) -> Result<Cow<'_, [u8]>, GatewayError> {
    let decoded = match detect(bytes) {
        Encoding::Utf8 => return Ok(Cow::Borrowed(bytes)),
        Encoding::Utf8Bom => return Ok(Cow::Borrowed(&bytes[3..])),
        Encoding::Utf16Bom => utf16(&bytes[2..], bytes[0] == 0xfe),
        Encoding::Utf32Bom => utf32(&bytes[4..], bytes[0] == 0),
        Encoding::Utf16 { big } => utf16(bytes, big),
        Encoding::Utf32 { big } => utf32(bytes, big),
    };
    decoded
        .map(|text| Cow::Owned(text.into_bytes()))
        .ok_or_else(|| GatewayError::InvalidJson("the body is not valid UTF-16 or UTF-32 text".into()))
}

fn utf16(b: &[u8], big: bool) -> Option<String> {
    if b.len() % 2 != 0 {
        return None;
    }
    let units = b.chunks_exact(2).map(|c| {
        let pair = [c[0], c[1]];
        if big {
            u16::from_be_bytes(pair)
        } else {
            u16::from_le_bytes(pair)
        }
    });
    char::decode_utf16(units).collect::<Result<String, _>>().ok()
}

fn utf32(b: &[u8], big: bool) -> Option<String> {
    if b.len() % 4 != 0 {
        return None;
    }
    b.chunks_exact(4)
        .map(|c| {
            let quad = [c[0], c[1], c[2], c[3]];
            char::from_u32(if big {
                u32::from_be_bytes(quad)
            } else {
                u32::from_le_bytes(quad)
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode16(text: &str, big: bool, bom: bool) -> Vec<u8> {
        let mut out = Vec::new();
        let units = bom.then_some(0xfeff).into_iter().chain(text.encode_utf16());
        for u in units {
            out.extend(if big { u.to_be_bytes() } else { u.to_le_bytes() });
        }
        out
    }

    fn encode32(text: &str, big: bool, bom: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for c in bom.then_some('\u{feff}').into_iter().chain(text.chars()) {
            let u = c as u32;
            out.extend(if big { u.to_be_bytes() } else { u.to_le_bytes() });
        }
        out
    }

    #[test]
    fn every_encoding_json_loads_detects_reads_to_the_same_text() {
        let text = r#"{"model": "m", "messages": [{"role": "user", "content": "héllo 😀"}]}"#;
        let mut forms = vec![
            text.as_bytes().to_vec(),
            [b"\xef\xbb\xbf".as_slice(), text.as_bytes()].concat(),
        ];
        for big in [true, false] {
            for bom in [true, false] {
                forms.push(encode16(text, big, bom));
                forms.push(encode32(text, big, bom));
            }
        }
        for form in forms {
            let got = json_text(&form).unwrap();
            assert_eq!(std::str::from_utf8(&got).unwrap(), text, "{form:?}");
        }
    }

    #[test]
    fn utf8_is_read_in_place() {
        let body = b"\xef\xbb\xbf{}";
        assert!(matches!(json_text(body).unwrap(), Cow::Borrowed(b"{}")));
        assert!(matches!(json_text(b"{}").unwrap(), Cow::Borrowed(_)));
    }

    #[test]
    fn text_that_does_not_decode_is_refused() {
        // An odd byte count in UTF-16, a lone surrogate, a code point past U+10FFFF.
        for bad in [
            &b"{\0\"\0}"[..5],
            &[0x7b, 0, 0x00, 0xd8][..],
            &[0x7b, 0, 0, 0, 0, 0, 0x11, 0][..],
        ] {
            assert!(json_text(bad).is_err(), "{bad:?}");
        }
    }
}
