//! The SQL92 lexer: turns an expression into tokens with byte offsets, and owns
//! the lexical rules (keywords, identifiers, quoting, number forms) that
//! `docs/filters.md` documents.

use std::cmp::Ordering;

use crate::broker::filter::FilterError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kw {
    Not,
    And,
    Or,
    Between,
    In,
    Is,
    Null,
    True,
    False,
    Contains,
    StartsWith,
    EndsWith,
}

impl Kw {
    fn from_ident(s: &str) -> Option<Kw> {
        const ALL: [(&str, Kw); 12] = [
            ("NOT", Kw::Not),
            ("AND", Kw::And),
            ("OR", Kw::Or),
            ("BETWEEN", Kw::Between),
            ("IN", Kw::In),
            ("IS", Kw::Is),
            ("NULL", Kw::Null),
            ("TRUE", Kw::True),
            ("FALSE", Kw::False),
            ("CONTAINS", Kw::Contains),
            ("STARTSWITH", Kw::StartsWith),
            ("ENDSWITH", Kw::EndsWith),
        ];
        ALL.iter()
            .find(|(name, _)| s.eq_ignore_ascii_case(name))
            .map(|(_, kw)| *kw)
    }

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Kw::Not => "NOT",
            Kw::And => "AND",
            Kw::Or => "OR",
            Kw::Between => "BETWEEN",
            Kw::In => "IN",
            Kw::Is => "IS",
            Kw::Null => "NULL",
            Kw::True => "TRUE",
            Kw::False => "FALSE",
            Kw::Contains => "CONTAINS",
            Kw::StartsWith => "STARTSWITH",
            Kw::EndsWith => "ENDSWITH",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Ident(String),
    Str(String),
    /// Numeric literal text, without sign; `float` when it has a `.` or exponent.
    Number {
        text: String,
        float: bool,
    },
    Kw(Kw),
    LParen,
    RParen,
    Comma,
    Plus,
    Minus,
    Cmp(CmpOp),
    Eof,
}

impl Tok {
    pub(super) fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("identifier `{s}`"),
            Tok::Str(s) => format!("string {}", quote(s)),
            Tok::Number { text, .. } => format!("number {text}"),
            Tok::Kw(k) => format!("keyword {}", k.as_str()),
            Tok::LParen => "'('".into(),
            Tok::RParen => "')'".into(),
            Tok::Comma => "','".into(),
            Tok::Plus => "'+'".into(),
            Tok::Minus => "'-'".into(),
            Tok::Cmp(op) => format!("'{}'", op.as_str()),
            Tok::Eof => "end of expression".into(),
        }
    }
}

fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b'$'
}

fn is_ident_part(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b == b'.'
}

/// Splits `src` into tokens, each with its byte offset. The last token is `Eof`.
pub(super) fn lex(src: &str) -> Result<Vec<(Tok, usize)>, FilterError> {
    let bytes = src.as_bytes();
    let mut toks = Vec::new();
    let mut i = 0;
    let err = |at: usize, msg: String| Err(FilterError::syntax(src, at, msg));
    while i < bytes.len() {
        let b = bytes[i];
        let start = i;
        let tok = match b {
            b' ' | b'\t' | b'\n' | b'\r' | b'\x0c' => {
                i += 1;
                continue;
            }
            b'(' => {
                i += 1;
                Tok::LParen
            }
            b')' => {
                i += 1;
                Tok::RParen
            }
            b',' => {
                i += 1;
                Tok::Comma
            }
            b'+' => {
                i += 1;
                Tok::Plus
            }
            b'-' => {
                i += 1;
                Tok::Minus
            }
            b'=' => {
                i += 1;
                Tok::Cmp(CmpOp::Eq)
            }
            b'<' => match bytes.get(i + 1) {
                Some(b'>') => {
                    i += 2;
                    Tok::Cmp(CmpOp::Ne)
                }
                Some(b'=') => {
                    i += 2;
                    Tok::Cmp(CmpOp::Le)
                }
                _ => {
                    i += 1;
                    Tok::Cmp(CmpOp::Lt)
                }
            },
            b'>' => {
                if bytes.get(i + 1) == Some(&b'=') {
                    i += 2;
                    Tok::Cmp(CmpOp::Ge)
                } else {
                    i += 1;
                    Tok::Cmp(CmpOp::Gt)
                }
            }
            b'!' if bytes.get(i + 1) == Some(&b'=') => {
                return err(start, "unexpected '!='; write '<>' for not-equal".into());
            }
            b'"' => {
                return err(
                    start,
                    "unexpected '\"'; string literals use single quotes ('text')".into(),
                );
            }
            b'\'' => {
                // 'text' with '' as an escaped quote.
                let mut value = String::new();
                let mut j = i + 1;
                loop {
                    match src[j..].find('\'') {
                        None => return err(start, "unterminated string literal".into()),
                        Some(k) => {
                            value.push_str(&src[j..j + k]);
                            j += k + 1;
                            if bytes.get(j) == Some(&b'\'') {
                                value.push('\'');
                                j += 1;
                            } else {
                                break;
                            }
                        }
                    }
                }
                i = j;
                Tok::Str(value)
            }
            b'0'..=b'9' | b'.' => {
                let (tok, end) = lex_number(src, i)?;
                i = end;
                tok
            }
            _ if is_ident_start(b) => {
                while i < bytes.len() && is_ident_part(bytes[i]) {
                    i += 1;
                }
                let word = &src[start..i];
                match Kw::from_ident(word) {
                    Some(kw) => Tok::Kw(kw),
                    None => Tok::Ident(word.to_owned()),
                }
            }
            _ => {
                let c = src[start..].chars().next().unwrap_or('?');
                return err(start, format!("unexpected character {c:?}"));
            }
        };
        toks.push((tok, start));
    }
    toks.push((Tok::Eof, src.len()));
    Ok(toks)
}

/// `123`, `123L`, `1.5`, `1.`, `.5`, `1e3`, `1.5E-3`.
fn lex_number(src: &str, start: usize) -> Result<(Tok, usize), FilterError> {
    let bytes = src.as_bytes();
    let digits = |mut i: usize| {
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        i
    };
    let mut i = digits(start);
    let mut float = false;
    if bytes.get(i) == Some(&b'.') {
        float = true;
        i = digits(i + 1);
    }
    if i == start + 1 && bytes[start] == b'.' {
        return Err(FilterError::syntax(src, start, "unexpected '.'"));
    }
    if matches!(bytes.get(i), Some(b'e' | b'E')) {
        let mut j = i + 1;
        if matches!(bytes.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        let end = digits(j);
        if end == j {
            return Err(FilterError::syntax(src, start, "malformed number exponent"));
        }
        float = true;
        i = end;
    }
    let mut text = src[start..i].to_owned();
    if !float && matches!(bytes.get(i), Some(b'l' | b'L')) {
        i += 1; // Java long suffix, as RocketMQ accepts.
    }
    if bytes.get(i).is_some_and(|&b| is_ident_part(b)) {
        let mut end = i;
        while end < bytes.len() && is_ident_part(bytes[end]) {
            end += 1;
        }
        return Err(FilterError::syntax(
            src,
            start,
            format!("malformed number `{}`", &src[start..end]),
        ));
    }
    if float {
        // Rust's float parser wants a digit on both sides of the point.
        if text.starts_with('.') {
            text.insert(0, '0');
        }
        let point = text.find('.');
        if let Some(p) = point.filter(|p| !text[p + 1..].starts_with(|c: char| c.is_ascii_digit()))
        {
            text.insert(p + 1, '0');
        }
    }
    Ok((Tok::Number { text, float }, i))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            CmpOp::Eq => "=",
            CmpOp::Ne => "<>",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }

    pub(super) fn is_ordering(self) -> bool {
        !matches!(self, CmpOp::Eq | CmpOp::Ne)
    }

    pub(super) fn test(self, ord: Ordering) -> bool {
        match self {
            CmpOp::Eq => ord == Ordering::Equal,
            CmpOp::Ne => ord != Ordering::Equal,
            CmpOp::Lt => ord == Ordering::Less,
            CmpOp::Le => ord != Ordering::Greater,
            CmpOp::Gt => ord == Ordering::Greater,
            CmpOp::Ge => ord != Ordering::Less,
        }
    }
}

pub(super) fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}
