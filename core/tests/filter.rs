//! Subscription filters through their public API: tag expressions (hash step and
//! exact step), SQL92 operators, NULL and type rules, precedence, error messages
//! with positions, and adversarial input that must fail cleanly, never panic.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rocketgate_core::broker::filter::{
    Filter, FilterError, FilterType, MAX_EXPRESSION_LEN, MAX_NESTING_DEPTH, NoProperties,
};

/// Java's `String.hashCode()` of known strings, as RocketMQ stores them.
const TAG_A_HASH: i64 = 2_598_919;
const TAG_B_HASH: i64 = 2_598_920;
const TAG_C_HASH: i64 = 2_598_921;

fn props(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn sql(expr: &str) -> Filter {
    Filter::sql92(expr).unwrap_or_else(|e| panic!("{expr:?} should parse: {e}"))
}

fn sql_err(expr: &str) -> String {
    match Filter::sql92(expr) {
        Ok(f) => panic!("{expr:?} should not parse, got {}", f.canonical()),
        Err(e) => e.to_string(),
    }
}

// ---------------------------------------------------------------------------
// Tags
// ---------------------------------------------------------------------------

#[test]
fn tag_hash_step_uses_java_string_hash() {
    let f = Filter::tag("TagA || TagB").unwrap();
    assert!(f.matches_tag_hash(TAG_A_HASH));
    assert!(f.matches_tag_hash(TAG_B_HASH));
    assert!(!f.matches_tag_hash(TAG_C_HASH));
    assert!(
        !f.matches_tag_hash(0),
        "no tag hashes to 0 (\"\".hashCode())"
    );

    // Non-ASCII tags hash over UTF-16 units: "温度" = 0x6E29 * 31 + 0x5EA6.
    assert!(Filter::tag("温度").unwrap().matches_tag_hash(898_461));
    // Outside the BMP: a surrogate pair, 0xD83D * 31 + 0xDE00.
    assert!(Filter::tag("😀").unwrap().matches_tag_hash(1_772_899));
    // Negative Java hashes stay negative (sign-extended, not zero-extended).
    assert!(
        Filter::tag("polygenelubricants")
            .unwrap()
            .matches_tag_hash(-2_147_483_648)
    );
    assert!(Filter::tag("hello").unwrap().matches_tag_hash(99_162_322));
}

#[test]
fn tag_exact_step_rules_out_hash_collisions() {
    // "Aa" and "BB" have the same Java hash (2112).
    let f = Filter::tag("Aa").unwrap();
    assert!(f.matches_tag_hash(2112));
    assert!(f.matches_tag(Some("Aa")));
    assert!(
        !f.matches_tag(Some("BB")),
        "the collision is caught on the real tag"
    );
}

#[test]
fn tag_table() {
    // (expression, tag of the message, matches)
    let cases: &[(&str, Option<&str>, bool)] = &[
        ("*", Some("TagA"), true),
        ("*", None, true),
        ("", Some("x"), true),
        ("", None, true),
        ("   ", None, true),
        ("TagA", Some("TagA"), true),
        ("TagA", Some("taga"), false),
        ("TagA", Some("TagB"), false),
        ("TagA", None, false),
        ("TagA", Some(""), false),
        ("TagA || TagB || TagC", Some("TagC"), true),
        ("TagA||TagB", Some("TagB"), true),
        ("  TagA   ||   TagB  ", Some("TagA"), true),
        ("TagA || TagB", Some("TagA || TagB"), false),
        ("TagA ||", Some("TagA"), true),
        ("TagA || *", Some("anything"), true),
        ("TagA || *", None, true),
        ("room1/temp || room2/temp", Some("room2/temp"), true),
        ("a|b", Some("a|b"), true),
        ("a|b", Some("a"), false),
        ("Tag A", Some("Tag A"), true),
        ("温度", Some("温度"), true),
    ];
    for (expr, tag, want) in cases {
        let f = Filter::tag(expr).unwrap_or_else(|e| panic!("{expr:?}: {e}"));
        assert_eq!(f.matches_tag(*tag), *want, "{expr:?} on {tag:?}");
        assert_eq!(f.matches(*tag, &NoProperties), *want, "{expr:?} on {tag:?}");
    }
}

#[test]
fn tag_filter_exposes_its_tags() {
    let f = Filter::tag("TagB || TagA || TagB").unwrap();
    assert_eq!(f.tags(), ["TagA".to_owned(), "TagB".to_owned()]);
    assert_eq!(f.canonical(), "TagA || TagB");
    assert_eq!(f.expression(), "TagB || TagA || TagB");
    assert_eq!(f.to_string(), "TAG(TagB || TagA || TagB)");
    assert!(!f.is_all());
    assert!(Filter::tag("*").unwrap().is_all());
    assert!(Filter::default().is_all());
    assert!(Filter::all().tags().is_empty());
}

#[test]
fn tag_errors() {
    let e = Filter::tag("||").unwrap_err();
    assert!(e.to_string().contains("has no tags"), "{e}");
    let e = Filter::tag(&"T||".repeat(2000)).unwrap_err();
    assert!(matches!(e, FilterError::TooLong { .. }), "{e}");
}

// ---------------------------------------------------------------------------
// SQL92: operators
// ---------------------------------------------------------------------------

#[test]
fn sql_operator_table() {
    let p = props(&[
        ("region", "eu"),
        ("price", "15"),
        ("ratio", "0.25"),
        ("neg", "-7"),
        ("name", "it's"),
        ("path", "sensors/room1/temp"),
        ("flag", "TRUE"),
        ("off", "false"),
        ("word", "abc"),
        ("empty", ""),
        ("a.b_c$d", "x"),
        ("big", "9223372036854775807"),
    ]);
    // (expression, expected match)
    let cases: &[(&str, bool)] = &[
        // = and <> on strings
        ("region = 'eu'", true),
        ("region = 'EU'", false),
        ("region <> 'us'", true),
        ("region <> 'eu'", false),
        ("'eu' = region", true),
        ("name = 'it''s'", true),
        ("empty = ''", true),
        ("a.b_c$d = 'x'", true),
        // numeric literal: the property is parsed as a number
        ("price = 15", true),
        ("price = 15.0", true),
        ("price = '15'", true),
        ("price <> 16", true),
        ("price > 10", true),
        ("price > 15", false),
        ("price >= 15", true),
        ("price < 15.5", true),
        ("price <= 14", false),
        ("10 < price", true),
        ("ratio > 0.2", true),
        ("ratio < .3", true),
        ("ratio = 2.5e-1", true),
        ("neg < 0", true),
        ("neg = -7", true),
        ("neg > -8", true),
        ("big = 9223372036854775807", true),
        ("big > 9223372036854775806", true),
        // comparing two properties
        ("price > neg", true),
        ("region = region", true),
        // BETWEEN
        ("price BETWEEN 10 AND 20", true),
        ("price BETWEEN 15 AND 15", true),
        ("price BETWEEN 16 AND 20", false),
        ("price NOT BETWEEN 16 AND 20", true),
        ("price NOT BETWEEN 10 AND 20", false),
        ("neg BETWEEN -10 AND -5", true),
        ("ratio BETWEEN 0 AND 1", true),
        ("price BETWEEN neg AND 100", true),
        // IN
        ("region IN ('eu', 'us')", true),
        ("region IN ('us')", false),
        ("region NOT IN ('us', 'cn')", true),
        ("region NOT IN ('eu')", false),
        ("price IN ('15')", true),
        ("name IN ('it''s')", true),
        // IS NULL
        ("missing IS NULL", true),
        ("missing IS NOT NULL", false),
        ("region IS NULL", false),
        ("region IS NOT NULL", true),
        ("empty IS NOT NULL", true),
        // CONTAINS / STARTSWITH / ENDSWITH (RocketMQ 5)
        ("path CONTAINS 'room1'", true),
        ("path CONTAINS 'room2'", false),
        ("path NOT CONTAINS 'room2'", true),
        ("path STARTSWITH 'sensors/'", true),
        ("path STARTSWITH 'room1'", false),
        ("path NOT STARTSWITH 'x'", true),
        ("path ENDSWITH '/temp'", true),
        ("path NOT ENDSWITH '/temp'", false),
        ("path CONTAINS ''", false),
        ("path NOT CONTAINS ''", false),
        // booleans
        ("TRUE", true),
        ("FALSE", false),
        ("flag", true),
        ("flag = TRUE", true),
        ("off = FALSE", true),
        ("NOT off", true),
        ("word", false),
        ("word = TRUE", false),
        // AND / OR / NOT
        ("region = 'eu' AND price > 10", true),
        ("region = 'eu' AND price > 20", false),
        ("region = 'us' OR price > 10", true),
        ("region = 'us' OR price > 20", false),
        ("NOT region = 'us'", true),
        ("NOT (region = 'eu')", false),
        ("NOT NOT region = 'eu'", true),
        // keywords are case-insensitive
        ("region in ('eu') and price between 1 and 20 or false", true),
        ("Region = 'eu'", false),
        ("path contains 'room' AND path NoT eNdSwItH 'x'", true),
        // whitespace of every kind
        ("\tregion\n=\r\n'eu'  ", true),
    ];
    for (expr, want) in cases {
        let f = sql(expr);
        assert_eq!(
            f.matches(None, &p),
            *want,
            "{expr}  (canonical {})",
            f.canonical()
        );
    }
}

// ---------------------------------------------------------------------------
// SQL92: NULL (missing property) and type rules
// ---------------------------------------------------------------------------

#[test]
fn sql_null_semantics() {
    let p = props(&[("x", "1"), ("s", "abc")]);
    // `m` is missing. A comparison with a missing property is UNKNOWN; UNKNOWN
    // never matches, NOT UNKNOWN is UNKNOWN, and AND/OR follow Kleene's rules.
    let cases: &[(&str, bool)] = &[
        ("m = 1", false),
        ("m <> 1", false),
        ("NOT (m = 1)", false),
        ("NOT (m <> 1)", false),
        ("m > 0 OR m <= 0", false),
        ("m = 'a' OR x = 1", true),
        ("m = 'a' AND x = 1", false),
        ("NOT (m = 'a' AND x = 2)", true),
        ("NOT (m = 'a' OR x = 2)", false),
        ("m IN ('a')", false),
        ("m NOT IN ('a')", false),
        ("m BETWEEN 0 AND 9", false),
        ("m NOT BETWEEN 0 AND 9", false),
        ("m CONTAINS 'a'", false),
        ("m NOT CONTAINS 'a'", false),
        ("NOT (m CONTAINS 'a')", false),
        ("m", false),
        ("NOT m", false),
        ("m IS NULL", true),
        ("NOT (m IS NOT NULL)", true),
        ("m IS NULL OR m = 1", true),
        // unparseable numbers are UNKNOWN too, not FALSE
        ("s > 1", false),
        ("NOT (s > 1)", false),
        ("s = 1", false),
        ("s <> 1", false),
        ("s BETWEEN 1 AND 2", false),
        ("s NOT BETWEEN 1 AND 2", false),
        ("s = 'abc'", true),
        ("x > s", false),
        ("NOT (x > s)", false),
    ];
    for (expr, want) in cases {
        assert_eq!(sql(expr).matches(None, &p), *want, "{expr}");
    }
}

#[test]
fn sql_numbers_vs_strings() {
    // A numeric literal makes the comparison numeric: "10" = 10 = 10.0 = "10.0".
    for value in ["10", "10.0", "1e1", "+10", "10.00"] {
        let p = props(&[("n", value)]);
        assert!(sql("n = 10").matches(None, &p), "{value} = 10");
        assert!(sql("n >= 9.5").matches(None, &p), "{value} >= 9.5");
    }
    // A string literal makes it a string comparison: "10.0" <> '10'.
    let p = props(&[("n", "10.0")]);
    assert!(!sql("n = '10'").matches(None, &p));
    assert!(sql("n = '10.0'").matches(None, &p));
    // Numbers compare by value, not text: "9" < 10 although "9" > "10" as text.
    let p = props(&[("n", "9")]);
    assert!(sql("n < 10").matches(None, &p));
    // Padding is not trimmed: " 10" is not a number.
    let p = props(&[("n", " 10")]);
    assert!(!sql("n = 10").matches(None, &p));
    assert!(!sql("n <> 10").matches(None, &p));
}

#[test]
fn sql_sees_the_tag_as_tags_property() {
    let f = sql("TAGS IN ('TagA', 'TagB') AND a > 1");
    let p = props(&[("a", "2")]);
    assert!(f.matches(Some("TagA"), &p));
    assert!(!f.matches(Some("TagC"), &p));
    assert!(!f.matches(None, &p));
    // An explicit TAGS property wins.
    let p = props(&[("a", "2"), ("TAGS", "TagB")]);
    assert!(f.matches(Some("TagC"), &p));
    // The hash step lets everything through for SQL92.
    assert!(f.matches_tag_hash(12345));
    assert!(f.matches_tag(None));
}

#[test]
fn sql_with_closure_lookup() {
    let stored = String::from("eu");
    let f = sql("region = 'eu' AND x IS NULL");
    assert!(f.matches_with(None, |k| (k == "region").then_some(stored.as_str())));
    let pairs: &[(&str, &str)] = &[("region", "eu")];
    assert!(f.matches(None, pairs));
}

// ---------------------------------------------------------------------------
// SQL92: precedence (OR < AND < NOT < comparison)
// ---------------------------------------------------------------------------

#[test]
fn sql_precedence() {
    let cases: &[(&str, &str)] = &[
        (
            "a = 1 OR b = 2 AND c = 3",
            "((a = 1) OR ((b = 2) AND (c = 3)))",
        ),
        (
            "a = 1 AND b = 2 OR c = 3",
            "(((a = 1) AND (b = 2)) OR (c = 3))",
        ),
        (
            "(a = 1 OR b = 2) AND c = 3",
            "(((a = 1) OR (b = 2)) AND (c = 3))",
        ),
        ("NOT a = 1 AND b = 2", "((NOT (a = 1)) AND (b = 2))"),
        ("NOT a = 1 OR b = 2", "((NOT (a = 1)) OR (b = 2))"),
        ("NOT (a = 1 OR b = 2)", "(NOT ((a = 1) OR (b = 2)))"),
        ("a = 1 OR b = 2 OR c = 3", "((a = 1) OR (b = 2) OR (c = 3))"),
        (
            "a = 1 AND b = 2 AND c = 3",
            "((a = 1) AND (b = 2) AND (c = 3))",
        ),
        (
            "a BETWEEN 1 AND 2 AND b = 3",
            "((a BETWEEN 1 AND 2) AND (b = 3))",
        ),
        ("NOT a NOT BETWEEN 1 AND 2", "(NOT (a NOT BETWEEN 1 AND 2))"),
        ("x IN ('b','a','b')", "(x IN ('a', 'b'))"),
        ("((((a = 1))))", "(a = 1)"),
        ("a IS NOT NULL AND NOT b", "((a IS NOT NULL) AND (NOT b))"),
    ];
    for (expr, want) in cases {
        assert_eq!(sql(expr).canonical(), *want, "{expr}");
    }
    // And the grouping shows in results: b = 2 AND c = 3 binds first.
    let p = props(&[("a", "1"), ("b", "0"), ("c", "0")]);
    assert!(sql("a = 1 OR b = 2 AND c = 3").matches(None, &p));
    assert!(!sql("(a = 1 OR b = 2) AND c = 3").matches(None, &p));
}

// ---------------------------------------------------------------------------
// SQL92: errors, with positions
// ---------------------------------------------------------------------------

#[test]
fn sql_error_messages_carry_positions() {
    let cases: &[(&str, &str)] = &[
        (
            "(a = 1 AND b = 2",
            "expected ')', found end of expression at column 17",
        ),
        (
            "",
            "empty SQL92 expression; expected a condition at column 1",
        ),
        (
            "   ",
            "empty SQL92 expression; expected a condition at column 4",
        ),
        ("a = 'abc", "unterminated string literal at column 5"),
        (
            "a = ",
            "expected a property name or a literal, found end of expression at column 5",
        ),
        (
            "a = 1 b = 2",
            "expected AND, OR or end of expression, found identifier `b` at column 7",
        ),
        ("a = 1)", "unbalanced ')' at column 6"),
        (
            "a != 1",
            "unexpected '!='; write '<>' for not-equal at column 3",
        ),
        (
            "a = \"x\"",
            "unexpected '\"'; string literals use single quotes ('text') at column 5",
        ),
        (
            "a = 1 AND",
            "expected a property name or a literal, found end of expression at column 10",
        ),
        (
            "a > 'x'",
            "'x' cannot be compared with '>'; only numbers are ordered at column 5",
        ),
        (
            "'x' <= 1",
            "'x' cannot be compared with '<='; only numbers are ordered at column 1",
        ),
        (
            "a < TRUE",
            "TRUE cannot be compared with '<'; only numbers are ordered at column 5",
        ),
        ("TRUE = 1", "TRUE cannot be compared with 1 at column 1"),
        (
            "a = NULL",
            "NULL is not a value here; test for it with IS NULL or IS NOT NULL at column 5",
        ),
        ("a IS 1", "expected NULL, found number 1 at column 6"),
        (
            "a BETWEEN 5 AND 1",
            "BETWEEN bounds are reversed: 5 is greater than 1 at column 11",
        ),
        (
            "a BETWEEN 1 OR 2",
            "expected AND in BETWEEN, found keyword OR at column 13",
        ),
        (
            "a BETWEEN 'x' AND 'y'",
            "'x' cannot be compared with BETWEEN; only numbers are ordered at column 11",
        ),
        (
            "a IN (1, 2)",
            "expected a string literal in the IN list, found number 1 at column 7",
        ),
        (
            "a IN ()",
            "expected a string literal in the IN list, found ')' at column 7",
        ),
        (
            "a IN ('x' 'y')",
            "expected ',' or ')' in the IN list, found string 'y' at column 11",
        ),
        (
            "a IN 'x'",
            "expected '(' after IN, found string 'x' at column 6",
        ),
        (
            "'x' IN ('x')",
            "IN needs a property name on its left, found 'x' at column 1",
        ),
        (
            "a CONTAINS b",
            "expected a string literal after CONTAINS, found identifier `b` at column 12",
        ),
        (
            "a NOT = 1",
            "expected BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH after NOT, found '=' at column 7",
        ),
        (
            "1",
            "1 is not a condition; expected a comparison after it at column 1",
        ),
        (
            "'text'",
            "'text' is not a condition; expected a comparison after it at column 1",
        ),
        ("a = 1e", "malformed number exponent at column 5"),
        ("a = 12abc", "malformed number `12abc` at column 5"),
        (
            "a = 99999999999999999999",
            "integer 99999999999999999999 does not fit in 64 bits; write it as a decimal at column 5",
        ),
        ("a = 1e999", "number 1e999 is out of range at column 5"),
        (
            "a = - b",
            "expected a number after the sign, found identifier `b` at column 7",
        ),
        ("a # 1", "unexpected character '#' at column 3"),
        ("温度 = 1", "unexpected character '温' at column 1"),
        ("a = 'ü' AND é", "unexpected character 'é' at column 13"),
        (
            "a = 1\nAND (b = 2",
            "expected ')', found end of expression at line 2, column 11",
        ),
        ("a = . ", "unexpected '.' at column 5"),
        (
            "AND = 1",
            "expected a property name or a literal, found keyword AND at column 1",
        ),
        (
            "()",
            "expected a property name or a literal, found ')' at column 2",
        ),
    ];
    for (expr, want) in cases {
        assert_eq!(sql_err(expr), *want, "{expr:?}");
    }
}

#[test]
fn error_positions_are_structured() {
    let e = Filter::sql92("(a = 1 AND b = 2").unwrap_err();
    let pos = e.position().unwrap();
    assert_eq!((pos.line, pos.column, pos.offset), (1, 17, 16));
    // Errors convert into the crate error for callers that use `?`.
    let core: rocketgate_core::Error = e.into();
    assert!(
        core.to_string().starts_with("invalid filter expression: "),
        "{core}"
    );
    assert!(matches!(
        "SQL".parse::<FilterType>(),
        Err(FilterError::UnknownType(_))
    ));
}

// ---------------------------------------------------------------------------
// Adversarial input
// ---------------------------------------------------------------------------

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    for depth in [MAX_NESTING_DEPTH + 1, 1000, 2000] {
        let parens = format!("{}a = 1{}", "(".repeat(depth), ")".repeat(depth));
        let e = Filter::sql92(&parens).unwrap_err();
        assert!(matches!(e, FilterError::TooDeep { .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with("filter expression nests deeper than 64 levels at column")
        );
        let nots = format!("{}a = 1", "NOT ".repeat(depth));
        assert!(matches!(
            Filter::sql92(&nots).unwrap_err(),
            FilterError::TooDeep { .. } | FilterError::TooLong { .. }
        ));
        let open_only = "(".repeat(depth);
        assert!(Filter::sql92(&open_only).is_err());
    }
    // Exactly at the limit is fine.
    let ok = format!(
        "{}a = 1{}",
        "(".repeat(MAX_NESTING_DEPTH),
        ")".repeat(MAX_NESTING_DEPTH)
    );
    assert!(sql(&ok).matches(None, &props(&[("a", "1")])));
    let ok = format!("{}a = 1", "NOT ".repeat(MAX_NESTING_DEPTH));
    assert!(sql(&ok).matches(None, &props(&[("a", "1")])));
}

#[test]
fn length_limit() {
    // A long flat OR chain under the limit parses and evaluates (stored flat, so
    // no deep recursion either way).
    let mut expr = String::from("a = 0");
    let mut i = 1;
    while expr.len() + 20 < MAX_EXPRESSION_LEN {
        expr.push_str(&format!(" OR a = {i}"));
        i += 1;
    }
    let f = sql(&expr);
    assert!(f.matches(None, &props(&[("a", &(i - 1).to_string())])));
    assert!(!f.matches(None, &props(&[("a", "-1")])));

    let huge = "a = 1 OR ".repeat(100_000) + "a = 1";
    let e = Filter::sql92(&huge).unwrap_err();
    assert_eq!(
        e,
        FilterError::TooLong {
            len: huge.len(),
            max: MAX_EXPRESSION_LEN
        }
    );
    assert!(e.to_string().contains("maximum is 4096 bytes"), "{e}");
    let long_string = format!("a = '{}'", "x".repeat(MAX_EXPRESSION_LEN));
    assert!(matches!(
        Filter::sql92(&long_string),
        Err(FilterError::TooLong { .. })
    ));
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = StdRng::seed_from_u64(0x5eed);
    for _ in 0..20_000 {
        let len = rng.random_range(0..64);
        let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        let text = String::from_utf8_lossy(&bytes);
        for ty in [FilterType::Sql92, FilterType::Tag] {
            if let Ok(f) = Filter::parse(ty, &text) {
                let _ = f.matches(Some("t"), &NoProperties);
            }
        }
    }
}

#[test]
fn random_token_soup_never_panics() {
    const VOCAB: &[&str] = &[
        "a",
        "b.c",
        "TAGS",
        "'x'",
        "'it''s'",
        "''",
        "'",
        "1",
        "-2",
        "3.5",
        ".5",
        "1e3",
        "1e",
        "9223372036854775808",
        "TRUE",
        "FALSE",
        "NULL",
        "NOT",
        "AND",
        "OR",
        "BETWEEN",
        "IN",
        "IS",
        "CONTAINS",
        "STARTSWITH",
        "ENDSWITH",
        "(",
        ")",
        ",",
        "=",
        "<>",
        "<",
        "<=",
        ">",
        ">=",
        "+",
        "-",
        "!=",
        "\"",
        "温",
        "\n",
    ];
    let mut rng = StdRng::seed_from_u64(42);
    let p = props(&[("a", "1"), ("b.c", "x"), ("TAGS", "t")]);
    let mut parsed = 0;
    for _ in 0..50_000 {
        let n = rng.random_range(1..12);
        let expr: Vec<&str> = (0..n)
            .map(|_| VOCAB[rng.random_range(0..VOCAB.len())])
            .collect();
        let expr = expr.join(" ");
        match Filter::sql92(&expr) {
            Ok(f) => {
                parsed += 1;
                let _ = f.matches(Some("t"), &p);
                let _ = f.matches(None, &NoProperties);
                // The canonical form is itself a valid expression with the same meaning.
                let again = Filter::sql92(&f.canonical())
                    .unwrap_or_else(|e| panic!("{expr:?} -> {:?}: {e}", f.canonical()));
                assert_eq!(again.canonical(), f.canonical(), "{expr:?}");
                assert_eq!(again.matches(Some("t"), &p), f.matches(Some("t"), &p));
            }
            Err(e) => {
                // Every error renders, and positional ones point inside the input.
                let _ = e.to_string();
                if let Some(pos) = e.position() {
                    assert!(pos.offset <= expr.len(), "{expr:?}: {e}");
                }
            }
        }
    }
    assert!(
        parsed > 100,
        "the soup should sometimes be valid ({parsed})"
    );
}
