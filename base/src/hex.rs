//! Hex digits, written by hand once: message ids are made for every message sent,
//! and `format!("{:02X}")` per byte was ~10 % of a batched send's instructions.

const UPPER: &[u8; 16] = b"0123456789ABCDEF";
const LOWER: &[u8; 16] = b"0123456789abcdef";

/// Appends `bytes` as upper-case hex (two digits a byte).
pub fn push_upper(out: &mut String, bytes: &[u8]) {
    push(out, bytes, UPPER);
}

/// Appends `bytes` as lower-case hex (two digits a byte).
pub fn push_lower(out: &mut String, bytes: &[u8]) {
    push(out, bytes, LOWER);
}

fn push(out: &mut String, bytes: &[u8], digits: &[u8; 16]) {
    out.reserve(bytes.len() * 2);
    for b in bytes {
        out.push(digits[usize::from(b >> 4)] as char);
        out.push(digits[usize::from(b & 15)] as char);
    }
}

/// Appends the low `digits` hex digits of `value`, upper case, most significant
/// first (zero-padded: `push_upper_digits(s, 0x2A, 4)` appends `002A`).
pub fn push_upper_digits(out: &mut String, value: u64, digits: u32) {
    for i in (0..digits).rev() {
        let nibble = value.checked_shr(4 * i).unwrap_or(0) & 15;
        out.push(UPPER[nibble as usize] as char);
    }
}

/// The bytes an even-length hex string (either case) stands for; `None` for
/// anything else.
pub fn decode(text: &str) -> Option<Vec<u8>> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let raw = text.as_bytes();
    if !raw.len().is_multiple_of(2) {
        return None;
    }
    raw.chunks(2)
        .map(|p| Some(nibble(p[0])? << 4 | nibble(p[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_cases_round_trip() {
        let bytes = [0x00, 0x7F, 0x80, 0xAB, 0xFF];
        let mut upper = String::new();
        push_upper(&mut upper, &bytes);
        assert_eq!(upper, "007F80ABFF");
        let mut lower = String::new();
        push_lower(&mut lower, &bytes);
        assert_eq!(lower, "007f80abff");
        assert_eq!(decode(&upper).unwrap(), bytes);
        assert_eq!(decode(&lower).unwrap(), bytes);
    }

    #[test]
    fn digits_are_zero_padded_and_cut_to_width() {
        let mut s = String::new();
        push_upper_digits(&mut s, 0x2A, 4);
        push_upper_digits(&mut s, 0x1234_5678, 4);
        push_upper_digits(&mut s, u64::MAX, 16);
        assert_eq!(s, "002A5678FFFFFFFFFFFFFFFF");
    }

    #[test]
    fn bad_hex_is_none() {
        assert_eq!(decode("abc"), None);
        assert_eq!(decode("zz"), None);
        assert_eq!(decode("é1"), None);
        assert_eq!(decode(""), Some(vec![]));
    }
}
