//! Evaluation of a parsed selector against a message's properties, in JMS
//! three-valued logic: `None` is UNKNOWN (a NULL decided the outcome).

use std::cmp::Ordering;

use super::{CmpOp, Expr, Num, Operand, StrOp};

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

pub(super) fn eval<'p>(e: &Expr, lookup: &dyn Fn(&str) -> Option<&'p str>) -> Option<bool> {
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
