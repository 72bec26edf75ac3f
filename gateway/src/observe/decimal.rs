//! An unsigned integer in decimal on the stack, without the formatting machinery: the upstream
//! request's Content-Length and the log line's integers are written on every request.

/// The decimal digits of one integer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decimal {
    buf: [u8; 20],
    start: usize,
}

impl Decimal {
    pub(crate) fn of(mut n: u64) -> Decimal {
        let mut d = Decimal {
            buf: [0; 20],
            start: 20,
        };
        loop {
            d.start -= 1;
            d.buf[d.start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return d;
            }
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    pub(crate) fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).expect("ASCII digits")
    }
}

#[cfg(test)]
mod tests {
    use super::Decimal;

    #[test]
    fn digits_read_as_display_writes_them() {
        for n in [0, 7, 10, 123_456_789, u64::MAX] {
            assert_eq!(Decimal::of(n).as_str(), n.to_string());
        }
    }
}
