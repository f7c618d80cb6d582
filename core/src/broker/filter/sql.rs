//! SQL92 / JMS-selector filters over message properties: lexer, recursive-descent
//! parser, AST and a three-valued evaluator.
//!
//! Hand-written on purpose: the language is small, its semantics (NULL, string
//! properties compared with numeric literals) are RocketMQ's rather than any SQL
//! dialect's, and a general SQL parser would accept far more than a selector.
//! Every recursive step is bounded by [`MAX_NESTING_DEPTH`], and `AND`/`OR` chains
//! are stored flat, so neither parsing, evaluation nor dropping an AST can
//! overflow the stack. Semantics are documented in `docs/filters.md`.

use std::cmp::Ordering;
use std::fmt;

use super::{FilterError, MAX_NESTING_DEPTH, Position};

// ---------------------------------------------------------------------------
// Lexer
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kw {
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

    fn as_str(self) -> &'static str {
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
enum Tok {
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
    fn describe(&self) -> String {
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
fn lex(src: &str) -> Result<Vec<(Tok, usize)>, FilterError> {
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

// ---------------------------------------------------------------------------
// AST
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    fn as_str(self) -> &'static str {
        match self {
            CmpOp::Eq => "=",
            CmpOp::Ne => "<>",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }

    fn is_ordering(self) -> bool {
        !matches!(self, CmpOp::Eq | CmpOp::Ne)
    }

    fn test(self, ord: Ordering) -> bool {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StrOp {
    Contains,
    StartsWith,
    EndsWith,
}

impl StrOp {
    fn as_str(self) -> &'static str {
        match self {
            StrOp::Contains => "CONTAINS",
            StrOp::StartsWith => "STARTSWITH",
            StrOp::EndsWith => "ENDSWITH",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    /// Parses a property value as a number: an integer if it is one, else a
    /// decimal. Unparseable text is `None` (the comparison becomes UNKNOWN).
    fn parse(s: &str) -> Option<Num> {
        if let Ok(i) = s.parse::<i64>() {
            return Some(Num::Int(i));
        }
        s.parse::<f64>().ok().map(Num::Float)
    }

    fn cmp(self, other: Num) -> Option<Ordering> {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => Some(a.cmp(&b)),
            (a, b) => a.as_f64().partial_cmp(&b.as_f64()),
        }
    }

    fn as_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Num::Int(i) => write!(f, "{i}"),
            Num::Float(x) => write!(f, "{x:?}"),
        }
    }
}

/// A value position: a property reference or a literal.
#[derive(Debug, Clone, PartialEq)]
enum Operand {
    Property(String),
    Str(String),
    Num(Num),
    Bool(bool),
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Operand::Property(p) => f.write_str(p),
            Operand::Str(s) => f.write_str(&quote(s)),
            Operand::Num(n) => write!(f, "{n}"),
            Operand::Bool(true) => f.write_str("TRUE"),
            Operand::Bool(false) => f.write_str("FALSE"),
        }
    }
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Or(Vec<Expr>),
    And(Vec<Expr>),
    Not(Box<Expr>),
    Compare {
        op: CmpOp,
        left: Operand,
        right: Operand,
    },
    Between {
        value: Operand,
        low: Operand,
        high: Operand,
        negated: bool,
    },
    /// `list` is sorted and deduplicated.
    In {
        property: String,
        list: Vec<String>,
        negated: bool,
    },
    IsNull {
        property: String,
        negated: bool,
    },
    StrMatch {
        op: StrOp,
        property: String,
        needle: String,
        negated: bool,
    },
    /// A property or `TRUE`/`FALSE` used directly as a condition.
    Truth(Operand),
}

fn not_kw(negated: bool) -> &'static str {
    if negated { "NOT " } else { "" }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |f: &mut fmt::Formatter<'_>, items: &[Expr], sep: &str| {
            f.write_str("(")?;
            for (i, e) in items.iter().enumerate() {
                if i > 0 {
                    write!(f, " {sep} ")?;
                }
                write!(f, "{e}")?;
            }
            f.write_str(")")
        };
        match self {
            Expr::Or(items) => join(f, items, "OR"),
            Expr::And(items) => join(f, items, "AND"),
            Expr::Not(e) => write!(f, "(NOT {e})"),
            Expr::Compare { op, left, right } => write!(f, "({left} {} {right})", op.as_str()),
            Expr::Between {
                value,
                low,
                high,
                negated,
            } => write!(f, "({value} {}BETWEEN {low} AND {high})", not_kw(*negated)),
            Expr::In {
                property,
                list,
                negated,
            } => {
                let items: Vec<String> = list.iter().map(|s| quote(s)).collect();
                write!(
                    f,
                    "({property} {}IN ({}))",
                    not_kw(*negated),
                    items.join(", ")
                )
            }
            Expr::IsNull { property, negated } => {
                write!(f, "({property} IS {}NULL)", not_kw(*negated))
            }
            Expr::StrMatch {
                op,
                property,
                needle,
                negated,
            } => write!(
                f,
                "({property} {}{} {})",
                not_kw(*negated),
                op.as_str(),
                quote(needle)
            ),
            Expr::Truth(o) => write!(f, "{o}"),
        }
    }
}

// ---------------------------------------------------------------------------
// Parser
// ---------------------------------------------------------------------------

/// A parsed SQL92 selector.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Selector {
    root: Expr,
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.root)
    }
}

struct Parser<'s> {
    src: &'s str,
    toks: Vec<(Tok, usize)>,
    pos: usize,
    depth: usize,
}

type PResult<T> = Result<T, FilterError>;

impl Selector {
    pub(crate) fn parse(src: &str) -> PResult<Selector> {
        let toks = lex(src)?;
        let mut p = Parser {
            src,
            toks,
            pos: 0,
            depth: 0,
        };
        if p.peek() == &Tok::Eof {
            return Err(p.error_here("empty SQL92 expression; expected a condition"));
        }
        let root = p.or_expr()?;
        if p.peek() != &Tok::Eof {
            let what = if p.peek() == &Tok::RParen {
                "unbalanced ')'".to_owned()
            } else {
                format!(
                    "expected AND, OR or end of expression, found {}",
                    p.peek().describe()
                )
            };
            return Err(p.error_here(what));
        }
        Ok(Selector { root })
    }

    /// True only when the selector evaluates to TRUE; FALSE and UNKNOWN (a NULL
    /// somewhere that decided the outcome) do not match.
    pub(crate) fn matches<'p>(&self, lookup: &dyn Fn(&str) -> Option<&'p str>) -> bool {
        eval(&self.root, lookup) == Some(true)
    }

    #[cfg(test)]
    fn evaluate<'p>(&self, lookup: &dyn Fn(&str) -> Option<&'p str>) -> Option<bool> {
        eval(&self.root, lookup)
    }
}

impl Parser<'_> {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos].0
    }

    fn offset(&self) -> usize {
        self.toks[self.pos].1
    }

    fn bump(&mut self) -> (Tok, usize) {
        let t = self.toks[self.pos].clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn eat_kw(&mut self, kw: Kw) -> bool {
        if self.peek() == &Tok::Kw(kw) {
            self.bump();
            true
        } else {
            false
        }
    }

    fn error_at(&self, offset: usize, msg: impl Into<String>) -> FilterError {
        FilterError::syntax(self.src, offset, msg)
    }

    fn error_here(&self, msg: impl Into<String>) -> FilterError {
        self.error_at(self.offset(), msg)
    }

    fn expected(&self, what: &str) -> FilterError {
        self.error_here(format!("expected {what}, found {}", self.peek().describe()))
    }

    fn expect(&mut self, tok: Tok, what: &str) -> PResult<()> {
        if *self.peek() == tok {
            self.bump();
            Ok(())
        } else {
            Err(self.expected(what))
        }
    }

    fn descend(&mut self) -> PResult<()> {
        self.depth += 1;
        if self.depth > MAX_NESTING_DEPTH {
            return Err(FilterError::TooDeep {
                max: MAX_NESTING_DEPTH,
                position: Position::locate(self.src, self.offset()),
            });
        }
        Ok(())
    }

    fn or_expr(&mut self) -> PResult<Expr> {
        let mut items = vec![self.and_expr()?];
        while self.eat_kw(Kw::Or) {
            items.push(self.and_expr()?);
        }
        Ok(if items.len() == 1 {
            items.pop().expect("one item")
        } else {
            Expr::Or(items)
        })
    }

    fn and_expr(&mut self) -> PResult<Expr> {
        let mut items = vec![self.not_expr()?];
        while self.eat_kw(Kw::And) {
            items.push(self.not_expr()?);
        }
        Ok(if items.len() == 1 {
            items.pop().expect("one item")
        } else {
            Expr::And(items)
        })
    }

    fn not_expr(&mut self) -> PResult<Expr> {
        if self.eat_kw(Kw::Not) {
            self.descend()?;
            let inner = self.not_expr()?;
            self.depth -= 1;
            Ok(Expr::Not(Box::new(inner)))
        } else {
            self.predicate()
        }
    }

    fn predicate(&mut self) -> PResult<Expr> {
        if self.peek() == &Tok::LParen {
            self.bump();
            self.descend()?;
            let inner = self.or_expr()?;
            self.depth -= 1;
            self.expect(Tok::RParen, "')'")?;
            return Ok(inner);
        }
        let (left, left_at) = self.operand()?;
        match self.peek().clone() {
            Tok::Cmp(op) => {
                self.bump();
                let (right, right_at) = self.operand()?;
                self.check_compare(op, &left, left_at, &right, right_at)?;
                Ok(Expr::Compare { op, left, right })
            }
            Tok::Kw(Kw::Is) => {
                self.bump();
                let negated = self.eat_kw(Kw::Not);
                if !self.eat_kw(Kw::Null) {
                    return Err(self.expected("NULL"));
                }
                let property = self.property_of(left, left_at, "IS NULL")?;
                Ok(Expr::IsNull { property, negated })
            }
            Tok::Kw(Kw::Not) => {
                self.bump();
                self.negatable(left, left_at, true)
            }
            Tok::Kw(Kw::Between | Kw::In | Kw::Contains | Kw::StartsWith | Kw::EndsWith) => {
                self.negatable(left, left_at, false)
            }
            _ => match left {
                Operand::Property(_) | Operand::Bool(_) => Ok(Expr::Truth(left)),
                other => Err(self.error_at(
                    left_at,
                    format!("{other} is not a condition; expected a comparison after it"),
                )),
            },
        }
    }

    /// The operators that take an optional `NOT` before them.
    fn negatable(&mut self, left: Operand, left_at: usize, negated: bool) -> PResult<Expr> {
        let (tok, at) = self.bump();
        match tok {
            Tok::Kw(Kw::Between) => {
                let (low, low_at) = self.operand()?;
                if !self.eat_kw(Kw::And) {
                    return Err(self.expected("AND in BETWEEN"));
                }
                let (high, high_at) = self.operand()?;
                for (o, o_at) in [(&left, left_at), (&low, low_at), (&high, high_at)] {
                    self.check_orderable(o, o_at, "BETWEEN")?;
                }
                if let (Operand::Num(l), Operand::Num(h)) = (&low, &high) {
                    let reversed = l.cmp(*h) == Some(Ordering::Greater);
                    if reversed {
                        return Err(self.error_at(
                            low_at,
                            format!("BETWEEN bounds are reversed: {l} is greater than {h}"),
                        ));
                    }
                }
                Ok(Expr::Between {
                    value: left,
                    low,
                    high,
                    negated,
                })
            }
            Tok::Kw(Kw::In) => {
                let property = self.property_of(left, left_at, "IN")?;
                self.expect(Tok::LParen, "'(' after IN")?;
                let mut list = vec![self.string_literal("a string literal in the IN list")?];
                while self.peek() == &Tok::Comma {
                    self.bump();
                    list.push(self.string_literal("a string literal in the IN list")?);
                }
                self.expect(Tok::RParen, "',' or ')' in the IN list")?;
                list.sort();
                list.dedup();
                Ok(Expr::In {
                    property,
                    list,
                    negated,
                })
            }
            Tok::Kw(kw @ (Kw::Contains | Kw::StartsWith | Kw::EndsWith)) => {
                let op = match kw {
                    Kw::Contains => StrOp::Contains,
                    Kw::StartsWith => StrOp::StartsWith,
                    _ => StrOp::EndsWith,
                };
                let property = self.property_of(left, left_at, op.as_str())?;
                let needle =
                    self.string_literal(&format!("a string literal after {}", op.as_str()))?;
                Ok(Expr::StrMatch {
                    op,
                    property,
                    needle,
                    negated,
                })
            }
            other => Err(self.error_at(
                at,
                format!(
                    "expected BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH after NOT, found {}",
                    other.describe()
                ),
            )),
        }
    }

    fn string_literal(&mut self, what: &str) -> PResult<String> {
        match self.peek().clone() {
            Tok::Str(s) => {
                self.bump();
                Ok(s)
            }
            _ => Err(self.expected(what)),
        }
    }

    fn property_of(&self, operand: Operand, at: usize, op: &str) -> PResult<String> {
        match operand {
            Operand::Property(p) => Ok(p),
            other => Err(self.error_at(
                at,
                format!("{op} needs a property name on its left, found {other}"),
            )),
        }
    }

    fn check_orderable(&self, o: &Operand, at: usize, op: &str) -> PResult<()> {
        match o {
            Operand::Str(_) | Operand::Bool(_) => Err(self.error_at(
                at,
                format!("{o} cannot be compared with {op}; only numbers are ordered"),
            )),
            Operand::Property(_) | Operand::Num(_) => Ok(()),
        }
    }

    fn check_compare(
        &self,
        op: CmpOp,
        left: &Operand,
        left_at: usize,
        right: &Operand,
        right_at: usize,
    ) -> PResult<()> {
        if op.is_ordering() {
            self.check_orderable(left, left_at, &format!("'{}'", op.as_str()))?;
            self.check_orderable(right, right_at, &format!("'{}'", op.as_str()))?;
        }
        match (left, right) {
            (Operand::Bool(_), Operand::Num(_) | Operand::Str(_))
            | (Operand::Num(_) | Operand::Str(_), Operand::Bool(_)) => {
                Err(self.error_at(left_at, format!("{left} cannot be compared with {right}")))
            }
            _ => Ok(()),
        }
    }

    fn operand(&mut self) -> PResult<(Operand, usize)> {
        let at = self.offset();
        let operand = match self.peek().clone() {
            Tok::Ident(p) => {
                self.bump();
                Operand::Property(p)
            }
            Tok::Str(s) => {
                self.bump();
                Operand::Str(s)
            }
            Tok::Kw(Kw::True) => {
                self.bump();
                Operand::Bool(true)
            }
            Tok::Kw(Kw::False) => {
                self.bump();
                Operand::Bool(false)
            }
            Tok::Kw(Kw::Null) => {
                return Err(self.error_here(
                    "NULL is not a value here; test for it with IS NULL or IS NOT NULL",
                ));
            }
            Tok::Number { .. } => Operand::Num(self.number(false)?),
            Tok::Plus => {
                self.bump();
                Operand::Num(self.number(false)?)
            }
            Tok::Minus => {
                self.bump();
                Operand::Num(self.number(true)?)
            }
            _ => return Err(self.expected("a property name or a literal")),
        };
        Ok((operand, at))
    }

    fn number(&mut self, negative: bool) -> PResult<Num> {
        let at = self.offset();
        let Tok::Number { text, float } = self.peek().clone() else {
            return Err(self.expected("a number after the sign"));
        };
        self.bump();
        let signed = if negative { format!("-{text}") } else { text };
        if float {
            match signed.parse::<f64>() {
                Ok(f) if f.is_finite() => Ok(Num::Float(f)),
                _ => Err(self.error_at(at, format!("number {signed} is out of range"))),
            }
        } else {
            signed.parse::<i64>().map(Num::Int).map_err(|_| {
                self.error_at(
                    at,
                    format!("integer {signed} does not fit in 64 bits; write it as a decimal"),
                )
            })
        }
    }
}

// ---------------------------------------------------------------------------
// Evaluation: three-valued logic, `None` = UNKNOWN.
// ---------------------------------------------------------------------------

/// A resolved operand. Property values are always text; literals keep their type.
#[derive(Clone, Copy)]
enum Val<'a> {
    Str(&'a str),
    Num(Num),
    Bool(bool),
}

impl Val<'_> {
    fn as_num(self) -> Option<Num> {
        match self {
            Val::Num(n) => Some(n),
            Val::Str(s) => Num::parse(s),
            Val::Bool(_) => None,
        }
    }

    fn as_bool(self) -> Option<bool> {
        match self {
            Val::Bool(b) => Some(b),
            Val::Str(s) if s.eq_ignore_ascii_case("true") => Some(true),
            Val::Str(s) if s.eq_ignore_ascii_case("false") => Some(false),
            Val::Str(_) | Val::Num(_) => None,
        }
    }
}

fn resolve<'v, 'a: 'v, 'p: 'v>(
    o: &'a Operand,
    lookup: &dyn Fn(&str) -> Option<&'p str>,
) -> Option<Val<'v>> {
    match o {
        Operand::Property(p) => lookup(p).map(Val::Str),
        Operand::Str(s) => Some(Val::Str(s)),
        Operand::Num(n) => Some(Val::Num(*n)),
        Operand::Bool(b) => Some(Val::Bool(*b)),
    }
}

fn compare(op: CmpOp, l: Val<'_>, r: Val<'_>) -> Option<bool> {
    let ord = match (l, r) {
        _ if op.is_ordering() => l.as_num()?.cmp(r.as_num()?)?,
        (Val::Num(_), _) | (_, Val::Num(_)) => l.as_num()?.cmp(r.as_num()?)?,
        (Val::Bool(_), _) | (_, Val::Bool(_)) => l.as_bool()?.cmp(&r.as_bool()?),
        (Val::Str(a), Val::Str(b)) => {
            if a == b {
                Ordering::Equal
            } else {
                Ordering::Less
            }
        }
    };
    Some(op.test(ord))
}

fn eval<'p>(e: &Expr, lookup: &dyn Fn(&str) -> Option<&'p str>) -> Option<bool> {
    match e {
        Expr::Or(items) => {
            let mut unknown = false;
            for item in items {
                match eval(item, lookup) {
                    Some(true) => return Some(true),
                    Some(false) => {}
                    None => unknown = true,
                }
            }
            if unknown { None } else { Some(false) }
        }
        Expr::And(items) => {
            let mut unknown = false;
            for item in items {
                match eval(item, lookup) {
                    Some(false) => return Some(false),
                    Some(true) => {}
                    None => unknown = true,
                }
            }
            if unknown { None } else { Some(true) }
        }
        Expr::Not(inner) => eval(inner, lookup).map(|b| !b),
        Expr::Compare { op, left, right } => {
            compare(*op, resolve(left, lookup)?, resolve(right, lookup)?)
        }
        Expr::Between {
            value,
            low,
            high,
            negated,
        } => {
            let v = resolve(value, lookup).and_then(Val::as_num);
            let lo = resolve(low, lookup).and_then(Val::as_num);
            let hi = resolve(high, lookup).and_then(Val::as_num);
            let cmp = |a: Option<Num>, b: Option<Num>| a?.cmp(b?);
            // x BETWEEN a AND b  ==  x >= a AND x <= b
            // x NOT BETWEEN a AND b  ==  x < a OR x > b   (both with UNKNOWN rules)
            let above_low = cmp(v, lo).map(|o| o != Ordering::Less);
            let below_high = cmp(v, hi).map(|o| o != Ordering::Greater);
            if *negated {
                kleene_or(above_low.map(|b| !b), below_high.map(|b| !b))
            } else {
                kleene_and(above_low, below_high)
            }
        }
        Expr::In {
            property,
            list,
            negated,
        } => {
            let v = lookup(property)?;
            Some(list.binary_search_by(|s| s.as_str().cmp(v)).is_ok() != *negated)
        }
        Expr::IsNull { property, negated } => Some(lookup(property).is_none() != *negated),
        Expr::StrMatch {
            op,
            property,
            needle,
            negated,
        } => {
            let v = lookup(property)?;
            if needle.is_empty() {
                // RocketMQ: an empty search string matches nothing, either way.
                return Some(false);
            }
            let hit = match op {
                StrOp::Contains => v.contains(needle.as_str()),
                StrOp::StartsWith => v.starts_with(needle.as_str()),
                StrOp::EndsWith => v.ends_with(needle.as_str()),
            };
            Some(hit != *negated)
        }
        Expr::Truth(o) => resolve(o, lookup)?.as_bool(),
    }
}

fn kleene_and(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}

fn kleene_or(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), Some(false)) => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval_with(src: &str, props: &[(&str, &str)]) -> Option<bool> {
        let sel = Selector::parse(src).unwrap_or_else(|e| panic!("{src}: {e}"));
        let props = props.to_vec();
        sel.evaluate(&|k: &str| props.iter().find(|(n, _)| *n == k).map(|(_, v)| *v))
    }

    #[test]
    fn three_valued_logic_with_missing_properties() {
        // (expression, result with x missing)
        let cases: &[(&str, Option<bool>)] = &[
            ("x = 1", None),
            ("x <> 1", None),
            ("NOT (x = 1)", None),
            ("x IS NULL", Some(true)),
            ("x IS NOT NULL", Some(false)),
            ("x = 1 OR TRUE", Some(true)),
            ("x = 1 AND FALSE", Some(false)),
            ("x = 1 AND TRUE", None),
            ("x = 1 OR FALSE", None),
            ("x IN ('a')", None),
            ("x NOT IN ('a')", None),
            ("x BETWEEN 1 AND 2", None),
            ("x NOT BETWEEN 1 AND 2", None),
            ("x CONTAINS 'a'", None),
            ("x NOT CONTAINS 'a'", None),
            ("x", None),
            ("NOT x", None),
        ];
        for (src, want) in cases {
            assert_eq!(eval_with(src, &[]), *want, "{src}");
        }
    }

    #[test]
    fn unparseable_numbers_are_unknown() {
        let p = [("x", "abc")];
        assert_eq!(eval_with("x = 1", &p), None);
        assert_eq!(eval_with("x > 1", &p), None);
        assert_eq!(eval_with("NOT (x > 1)", &p), None);
        assert_eq!(eval_with("x NOT BETWEEN 1 AND 2", &p), None);
        assert_eq!(eval_with("x = 'abc'", &p), Some(true));
    }

    #[test]
    fn number_lexing_forms() {
        for (src, want) in [
            ("x = 1.", "(x = 1.0)"),
            ("x = .5", "(x = 0.5)"),
            ("x = 1e3", "(x = 1000.0)"),
            ("x = 1.5E-1", "(x = 0.15)"),
            ("x = 10L", "(x = 10)"),
            ("x = -9223372036854775808", "(x = -9223372036854775808)"),
            ("x = - 3", "(x = -3)"),
            ("x = +3", "(x = 3)"),
        ] {
            assert_eq!(Selector::parse(src).unwrap().to_string(), want, "{src}");
        }
    }

    #[test]
    fn deep_not_chain_is_bounded() {
        let src = "NOT ".repeat(1000) + "x";
        assert!(matches!(
            Selector::parse(&src),
            Err(FilterError::TooDeep { .. })
        ));
    }
}
