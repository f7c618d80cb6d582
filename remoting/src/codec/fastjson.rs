//! The JSON dialect of Alibaba fastjson, which Java RocketMQ uses for headers and bodies.
//!
//! fastjson writes a `Map<Long, String>` with bare numeric keys (`{0:"127.0.0.1:10911"}`)
//! and reads unquoted keys and single-quoted strings. We read liberally ([`from_slice`]
//! rewrites such text into strict JSON before handing it to serde) and write strict JSON,
//! except where an old client expects fastjson's exact form ([`unquote_numeric_keys`]).
//! Object fields are declared in alphabetical order in our wire structs because fastjson
//! sorts them so; unknown fields are ignored on read.

use std::borrow::Cow;

use serde::de::DeserializeOwned;

/// Parses fastjson-dialect JSON.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    match serde_json::from_slice(bytes) {
        Ok(v) => Ok(v),
        Err(strict_err) => match std::str::from_utf8(bytes).map(to_strict) {
            Ok(Cow::Owned(relaxed)) => serde_json::from_str(&relaxed),
            _ => Err(strict_err),
        },
    }
}

#[derive(Clone, Copy)]
enum Container {
    Object { expect_key: bool },
    Array,
}

/// Copies a structural character and tracks where keys are expected: both
/// scanners below must agree on this, so it lives once.
fn structural(c: char, stack: &mut Vec<Container>, out: &mut String) {
    match c {
        '{' => stack.push(Container::Object { expect_key: true }),
        '[' => stack.push(Container::Array),
        '}' | ']' => {
            stack.pop();
        }
        _ => {
            if let Some(Container::Object { expect_key }) = stack.last_mut() {
                *expect_key = c == ',';
            }
        }
    }
    out.push(c);
}

fn is_token_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '$' | '-' | '.' | '+')
}

/// Rewrites fastjson text into strict JSON: bare object keys are quoted and single-quoted
/// strings become double-quoted. Anything else passes through, so invalid input stays
/// invalid (serde reports it). Borrowed when nothing changed.
pub fn to_strict(input: &str) -> Cow<'_, str> {
    let mut out = String::with_capacity(input.len() + 16);
    let mut stack: Vec<Container> = Vec::new();
    let mut changed = false;
    let mut chars = input.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                out.push('"');
                while let Some(c) = chars.next() {
                    out.push(c);
                    match c {
                        '\\' => {
                            if let Some(n) = chars.next() {
                                out.push(n);
                            }
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '\'' => {
                changed = true;
                out.push('"');
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => match chars.next() {
                            Some('\'') => out.push('\''),
                            Some(n) => {
                                out.push('\\');
                                out.push(n);
                            }
                            None => {}
                        },
                        '\'' => break,
                        '"' => out.push_str("\\\""),
                        c => out.push(c),
                    }
                }
                out.push('"');
            }
            '{' | '[' | '}' | ']' | ',' | ':' => structural(c, &mut stack, &mut out),
            c if is_token_char(c)
                && matches!(stack.last(), Some(Container::Object { expect_key: true })) =>
            {
                changed = true;
                out.push('"');
                out.push(c);
                while let Some(&n) = chars.peek() {
                    if !is_token_char(n) {
                        break;
                    }
                    out.push(n);
                    chars.next();
                }
                out.push('"');
                if let Some(Container::Object { expect_key }) = stack.last_mut() {
                    *expect_key = false;
                }
            }
            c => out.push(c),
        }
    }
    if changed {
        Cow::Owned(out)
    } else {
        Cow::Borrowed(input)
    }
}

/// Rewrites strict JSON so that object keys made only of digits are written bare, as
/// fastjson writes a `Map<Long, _>` (`{"0":"a"}` becomes `{0:"a"}`). Strings that are
/// values, not keys, are untouched.
pub fn unquote_numeric_keys(strict: &str) -> String {
    let mut out = String::with_capacity(strict.len());
    let mut stack: Vec<Container> = Vec::new();
    let mut chars = strict.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                let mut s = String::new();
                let mut escaped = false;
                for c in chars.by_ref() {
                    if escaped {
                        escaped = false;
                    } else if c == '\\' {
                        escaped = true;
                    } else if c == '"' {
                        break;
                    }
                    s.push(c);
                }
                let is_key = matches!(stack.last(), Some(Container::Object { expect_key: true }));
                let numeric = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
                if is_key && numeric {
                    out.push_str(&s);
                } else {
                    out.push('"');
                    out.push_str(&s);
                    out.push('"');
                }
            }
            '{' | '[' | '}' | ']' | ',' | ':' => structural(c, &mut stack, &mut out),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn bare_numeric_keys_are_read() {
        let m: BTreeMap<u64, String> = from_slice(br#"{0:"127.0.0.1:10911",1:"b"}"#).unwrap();
        assert_eq!(m[&0], "127.0.0.1:10911");
        assert_eq!(m[&1], "b");
    }

    #[test]
    fn single_quotes_and_bare_names_are_read() {
        let v: serde_json::Value = from_slice(br#"{name:'it\'s', 'a':'say "hi"', n: 3}"#).unwrap();
        assert_eq!(v["name"], "it's");
        assert_eq!(v["a"], "say \"hi\"");
        assert_eq!(v["n"], 3);
    }

    #[test]
    fn strict_input_is_borrowed_and_values_untouched() {
        let s = r#"{"a":[1,"x:y",{"b":true}],"c":null}"#;
        assert!(matches!(to_strict(s), Cow::Borrowed(_)));
        let v: serde_json::Value = from_slice(s.as_bytes()).unwrap();
        assert_eq!(v["a"][1], "x:y");
    }

    #[test]
    fn numeric_keys_are_written_bare_but_values_are_not() {
        let strict = r#"{"brokerAddrs":{"0":"127.0.0.1:10911","12":"x"},"n":["0"],"s":"0"}"#;
        assert_eq!(
            unquote_numeric_keys(strict),
            r#"{"brokerAddrs":{0:"127.0.0.1:10911",12:"x"},"n":["0"],"s":"0"}"#
        );
    }

    #[test]
    fn escaped_quotes_survive_both_directions() {
        let strict = r#"{"k\"0":"v\"1","1":"\\"}"#;
        let bare = unquote_numeric_keys(strict);
        assert_eq!(bare, r#"{"k\"0":"v\"1",1:"\\"}"#);
        let back: BTreeMap<String, String> = from_slice(bare.as_bytes()).unwrap();
        assert_eq!(back["k\"0"], "v\"1");
        assert_eq!(back["1"], "\\");
    }
}
