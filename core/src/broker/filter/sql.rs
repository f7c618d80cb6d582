//! SQL92 / JMS-selector filters over message properties: the AST and its
//! recursive-descent parser. The lexer is in `sql/lex.rs`, the three-valued
//! evaluator in `sql/eval.rs`.
//!
//! Hand-written on purpose: the language is small, its semantics (NULL, string
//! properties compared with numeric literals) are RocketMQ's rather than any SQL
//! dialect's, and a general SQL parser would accept far more than a selector.
//! Every recursive step is bounded by [`MAX_NESTING_DEPTH`], and `AND`/`OR` chains
//! are stored flat, so neither parsing, evaluation nor dropping an AST can
//! overflow the stack. Semantics are documented in `docs/filters.md`.

use std::cmp::Ordering;
use std::fmt;

mod eval;
mod lex;

use super::{FilterError, MAX_NESTING_DEPTH, Position};
use eval::eval;
use lex::{CmpOp, Kw, Tok, lex, quote};

// ---------------------------------------------------------------------------
// AST
// ---------------------------------------------------------------------------

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
