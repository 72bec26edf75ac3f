//! Values read the way vLLM's request models read them: pydantic 2 in lax (Python) mode, on the
//! dict that `json.loads` made of the body. The gateway reads a field only where it must, and
//! then it must never refuse what vLLM would coerce, nor take as valid what vLLM refuses (a
//! value that is neither is left for vLLM to refuse in its own words). Each rule below follows
//! pydantic-core's lax coercions (`src/input/input_python.rs`, `src/input/shared.rs`) and is
//! held by a test against answers of the pydantic 2.14 that vLLM 0.33 installs.

use serde_json::Value;

/// A `bool` field: `true`/`false`; the integers 0 and 1 (and 0.0, 1.0); the strings
/// `0 off f false n no` and `1 on t true y yes` in any case, without surrounding spaces.
pub(crate) fn lax_bool(value: &Value) -> Option<bool> {
    match value {
        Value::Bool(b) => Some(*b),
        Value::Number(n) => match n.as_f64() {
            Some(0.0) => Some(false),
            Some(1.0) => Some(true),
            _ => None,
        },
        Value::String(s) => {
            const FALSE: &[&str] = &["0", "off", "f", "false", "n", "no"];
            const TRUE: &[&str] = &["1", "on", "t", "true", "y", "yes"];
            if FALSE.iter().any(|w| w.eq_ignore_ascii_case(s)) {
                Some(false)
            } else if TRUE.iter().any(|w| w.eq_ignore_ascii_case(s)) {
                Some(true)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// An `int` field: an integer; a boolean (Python's `True` is 1); a float without a fraction
/// inside i64; a string of one after Python's `strip()` — an optional sign, digits with single
/// underscores between them, and optionally a `.` followed only by zeros. Wide enough for every
/// value the gateway compares; larger integers (pydantic takes them) are left to vLLM.
pub(crate) fn lax_integer(value: &Value) -> Option<i128> {
    match value {
        Value::Bool(b) => Some(i128::from(*b)),
        Value::Number(v) => v
            .as_i64()
            .map(i128::from)
            .or_else(|| v.as_u64().map(i128::from))
            .or_else(|| {
                v.as_f64()
                    .filter(|f| f.fract() == 0.0 && (i64::MIN as f64..=i64::MAX as f64).contains(f))
                    .map(|f| f as i128)
            }),
        Value::String(s) => integer_text(s.trim()),
        _ => None,
    }
}

/// Python's `int(text)` with pydantic's allowance for a zero fraction (`"2.00"`).
fn integer_text(text: &str) -> Option<i128> {
    let whole = match text.split_once('.') {
        Some((whole, zeros)) if !zeros.is_empty() && zeros.bytes().all(|b| b == b'0') => whole,
        Some(_) => return None,
        None => text,
    };
    let (negative, digits) = match whole.as_bytes().first()? {
        b'-' => (true, &whole[1..]),
        b'+' => (false, &whole[1..]),
        _ => (false, whole),
    };
    // Underscores only between digits, one at a time.
    let bytes = digits.as_bytes();
    let well_placed = !bytes.is_empty()
        && bytes.first().is_some_and(u8::is_ascii_digit)
        && bytes.last().is_some_and(u8::is_ascii_digit)
        && bytes.iter().all(|b| b.is_ascii_digit() || *b == b'_')
        && !digits.contains("__");
    if !well_placed {
        return None;
    }
    let magnitude: i128 = digits.replace('_', "").parse().ok()?;
    Some(if negative { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Each row as pydantic 2.14 (vLLM 0.33's) answered `TypeAdapter(bool).validate_python`.
    #[test]
    fn booleans_coerce_as_pydantic_does() {
        let cases = [
            (json!(true), Some(true)),
            (json!(1), Some(true)),
            (json!(0), Some(false)),
            (json!(2), None),
            (json!(1.0), Some(true)),
            (json!(0.0), Some(false)),
            (json!(1.5), None),
            (json!("true"), Some(true)),
            (json!("TRUE"), Some(true)),
            (json!(" true"), None),
            (json!("yes"), Some(true)),
            (json!("on"), Some(true)),
            (json!("1"), Some(true)),
            (json!("0"), Some(false)),
            (json!("t"), Some(true)),
            (json!("f"), Some(false)),
            (json!("y"), Some(true)),
            (json!("n"), Some(false)),
            (json!("off"), Some(false)),
            (json!("no"), Some(false)),
            (json!("maybe"), None),
            (json!([]), None),
            (json!({}), None),
        ];
        for (value, want) in cases {
            assert_eq!(lax_bool(&value), want, "{value}");
        }
    }

    /// Each row as pydantic 2.14 answered `TypeAdapter(int).validate_python`.
    #[test]
    fn integers_coerce_as_pydantic_does() {
        let cases = [
            (json!(2), Some(2)),
            (json!(2.0), Some(2)),
            (json!(2.5), None),
            (json!(1e20), None),
            (json!(true), Some(1)),
            (json!(false), Some(0)),
            (json!("2"), Some(2)),
            (json!(" 2 "), Some(2)),
            (json!("\t4\n"), Some(4)),
            (json!("2.0"), Some(2)),
            (json!("2.00"), Some(2)),
            (json!("2."), None),
            (json!("2.5"), None),
            (json!("2.01"), None),
            (json!("+2"), Some(2)),
            (json!(" +3 "), Some(3)),
            (json!("-1"), Some(-1)),
            (json!("-0"), Some(0)),
            (json!("0002"), Some(2)),
            (json!("0x2"), None),
            (json!("1_000"), Some(1000)),
            (json!("_2"), None),
            (json!("2_"), None),
            (json!("1__0"), None),
            (json!("1 0"), None),
            (json!(""), None),
            (json!("1e2"), None),
            (json!("Infinity"), None),
            (json!("٢"), None),
            (json!(null), None),
        ];
        for (value, want) in cases {
            assert_eq!(lax_integer(&value), want, "{value}");
        }
    }
}
