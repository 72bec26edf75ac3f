//! A certificate's validity period (RFC 5280 §4.1.2.5), read from its DER by walking the few
//! fields before it: rustls never checks the server's own certificate's dates, and a gateway
//! that started serving an expired one would fail every client's handshake instead of its start.

/// Seconds since the Unix epoch of a certificate's notBefore and notAfter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Validity {
    pub(super) not_before: i64,
    pub(super) not_after: i64,
}

/// One DER element: its tag and contents; the rest of the input after it.
fn element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = match first {
        n if n < 0x80 => (usize::from(n), rest),
        n => {
            let octets = usize::from(n & 0x7f);
            if octets == 0 || octets > 4 || rest.len() < octets {
                return None;
            }
            let len = rest[..octets]
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
            (len, &rest[octets..])
        }
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

const SEQUENCE: u8 = 0x30;
const VERSION: u8 = 0xa0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// The validity of a DER certificate; `None` when it is not one this walk can read.
pub(super) fn validity(der: &[u8]) -> Option<Validity> {
    let (SEQUENCE, cert, _) = element(der)? else {
        return None;
    };
    let (SEQUENCE, tbs, _) = element(cert)? else {
        return None;
    };
    let mut rest = tbs;
    let (tag, _, after) = element(rest)?;
    if tag == VERSION {
        rest = after;
    }
    // serialNumber, signature, issuer, then validity.
    for _ in 0..3 {
        rest = element(rest)?.2;
    }
    let (SEQUENCE, period, _) = element(rest)? else {
        return None;
    };
    let (tag, not_before, after) = element(period)?;
    let not_before = time(tag, not_before)?;
    let (tag, not_after, _) = element(after)?;
    Some(Validity {
        not_before,
        not_after: time(tag, not_after)?,
    })
}

/// UTCTime (`YYMMDDHHMMSSZ`, years 1950–2049) or GeneralizedTime (`YYYYMMDDHHMMSSZ`).
fn time(tag: u8, text: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(text).ok()?.strip_suffix('Z')?;
    let (year, rest) = match tag {
        UTC_TIME if text.len() == 12 => {
            let yy: i64 = text[..2].parse().ok()?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &text[2..])
        }
        GENERALIZED_TIME if text.len() == 14 => (text[..4].parse().ok()?, &text[4..]),
        _ => return None,
    };
    let field = |i: usize| rest.get(i..i + 2)?.parse::<i64>().ok();
    let (month, day) = (field(0)?, field(2)?);
    let (h, m, s) = (field(4)?, field(6)?, field(8)?);
    Some(days_from_civil(year, month, day) * 86_400 + h * 3600 + m * 60 + s)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A date for a message: `2026-12-07 21:46:09 UTC`.
pub(super) fn show(unix: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix.max(0).unsigned_abs());
    let text = humantime::format_rfc3339_seconds(t).to_string();
    text.replacen('T', " ", 1).replace('Z', " UTC")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_time_forms_and_the_calendar() {
        assert_eq!(time(UTC_TIME, b"700101000000Z"), Some(0));
        assert_eq!(time(UTC_TIME, b"491231235959Z"), Some(2_524_607_999));
        assert_eq!(time(GENERALIZED_TIME, b"20261207214609Z"), Some(1_796_679_969));
        assert_eq!(time(UTC_TIME, b"261207214609"), None, "no zone");
        assert_eq!(show(1_796_679_969), "2026-12-07 21:46:09 UTC");
    }

    /// A certificate's head as DER: a version, serial, algorithm and issuer, then the validity.
    fn cert(not_before: &[u8], not_after: &[u8]) -> Vec<u8> {
        let wrap = |tag: u8, body: &[u8]| {
            let mut v = vec![tag, u8::try_from(body.len()).unwrap()];
            v.extend_from_slice(body);
            v
        };
        let period = [wrap(UTC_TIME, not_before), wrap(UTC_TIME, not_after)].concat();
        let tbs = [
            wrap(VERSION, &wrap(0x02, &[2])),
            wrap(0x02, &[1, 2, 3]),
            wrap(SEQUENCE, &wrap(0x06, &[42])),
            wrap(SEQUENCE, &[]),
            wrap(SEQUENCE, &period),
            wrap(SEQUENCE, &[]),
        ]
        .concat();
        wrap(SEQUENCE, &[wrap(SEQUENCE, &tbs), wrap(SEQUENCE, &[])].concat())
    }

    #[test]
    fn reads_the_validity_after_the_fields_before_it() {
        let der = cert(b"250101000000Z", b"270101000000Z");
        let v = validity(&der).unwrap();
        assert_eq!(show(v.not_before), "2025-01-01 00:00:00 UTC");
        assert_eq!(show(v.not_after), "2027-01-01 00:00:00 UTC");
        assert_eq!(validity(&der[..der.len() - 3]), None, "cut short");
        assert_eq!(validity(b"not a certificate"), None);
    }
}
