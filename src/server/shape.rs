//! The shape of a statement's text, checked before anything parses or plans it.
//!
//! Parsing, planning and optimising recurse over a statement's expression tree, and so do
//! cloning, printing and dropping it: a short text can build a tree deep enough to overflow a
//! thread's stack (`SELECT 1+1+...` with a few thousand terms; 606 bytes were enough on a
//! 2 MiB stack in a debug build), which aborts the process, or one whose planning time grows
//! exponentially with its depth (DataFusion's simplifier on `coalesce(coalesce(...))`), which
//! no statement timeout can interrupt since planning never yields. A wire client must not be
//! able to do either, so [`check`] walks the tokens (an iterative scan, no recursion) and
//! refuses, with SQLSTATE 54001, a text whose nesting, operator chains, function nesting or
//! number of queries is past the limits below. The limits are far above what applications
//! and BI tools send, and far below what the server's threads (32 MiB stacks, see
//! [`super::Server`]) can hold. It also counts the statements in the text, since the extended
//! protocol takes exactly one.

use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use datafusion_postgres::pgwire::error::{ErrorInfo, PgWireError};

/// Deepest expression, counted as the operators chained on the way down plus the
/// parentheses around it.
pub const MAX_DEPTH: usize = 1_000;
/// Deepest nesting of function calls (`f(g(h(...)))`).
pub const MAX_FUNCTION_NESTING: usize = 16;
/// Most `SELECT`s (subqueries, set operations, common table expressions) in one text.
pub const MAX_QUERIES: usize = 500;
/// Most relations (items of `FROM` lists and `JOIN`s, subqueries' included) in one text:
/// DataFusion plans a join of n relations in time that grows faster than n (200 took 4.7 s
/// in a debug build, 1,000 took 27 s in a release one), and planning never yields, so no
/// statement timeout stops it.
pub const MAX_RELATIONS: usize = 100;
/// Most tokens in one expression between commas: the backstop for any construct that
/// nests without an operator counted above (a 5,000-token run is far from the depth that
/// overflows a connection's stack; a `CASE` of 800 branches fits).
pub const MAX_RUN_TOKENS: usize = 5_000;

/// The cast types pg_catalog's emulation rewrites into a lookup subquery, with the
/// `SELECT`s and relations each cast becomes: `'t'::regclass` turns into a join of
/// `pg_class` and `pg_namespace` with a derived table (about 550 KB of plan per cast was
/// measured), after this check has run, so each one is counted here as what it becomes.
const LOOKUP_CASTS: &[(&str, usize, usize)] = &[
    ("REGCLASS", 2, 3),
    ("REGNAMESPACE", 1, 1),
    ("REGTYPE", 1, 1),
    ("REGPROC", 1, 1),
];

/// What the scan found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shape {
    /// Statements in the text (separated by semicolons, empty ones not counted).
    pub statements: usize,
    /// The deepest expression, as estimated by [`check`].
    pub depth: usize,
    /// The deepest nesting of function calls.
    pub function_nesting: usize,
    /// `SELECT` keywords.
    pub queries: usize,
    /// The most tokens in one expression (between commas, in one pair of brackets).
    pub longest_run: usize,
    /// Relations named in `FROM` lists and by `JOIN`s.
    pub relations: usize,
}

fn too_complex(what: &str, found: usize, limit: usize) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".into(),
        "54001".into(),
        format!(
            "statement too complex: {what} is {found}, Pulpitum takes at most {limit}; \
             split the statement or use IN lists and joins"
        ),
    )))
}

/// Keywords that wrap the expression before or after them in another node: each one in a
/// chain is a level of the tree (`x IS NULL IS NULL`, `NOT NOT x`, `x IN (1) IN (1)`,
/// `CASE WHEN CASE WHEN ...`). Clause keywords (`SELECT`, `FROM`, `WHERE`, `THEN`) and
/// names are not counted: they do not nest.
const OPERATOR_KEYWORDS: &[&str] = &[
    "AND",
    "OR",
    "UNION",
    "EXCEPT",
    "INTERSECT",
    "NOT",
    "IS",
    "IN",
    "LIKE",
    "ILIKE",
    "SIMILAR",
    "RLIKE",
    "REGEXP",
    "BETWEEN",
    "AT",
    "COLLATE",
    "CASE",
    "OVERLAPS",
    "ESCAPE",
    "DIV",
    "XOR",
    "ANY",
    "ALL",
    "SOME",
    "EXISTS",
    "INTERVAL",
    "OPERATOR",
    "ISNULL",
    "NOTNULL",
];

fn is_operator(t: &Token) -> bool {
    match t {
        Token::Word(w) => {
            w.quote_style.is_none()
                && OPERATOR_KEYWORDS
                    .iter()
                    .any(|k| w.value.eq_ignore_ascii_case(k))
        }
        Token::Whitespace(_)
        | Token::Comma
        | Token::LParen
        | Token::RParen
        | Token::SemiColon
        | Token::Period
        | Token::Placeholder(_)
        | Token::LBracket
        | Token::RBracket
        | Token::EOF => false,
        Token::Number(..)
        | Token::Char(_)
        | Token::SingleQuotedString(_)
        | Token::DoubleQuotedString(_)
        | Token::DollarQuotedString(_)
        | Token::NationalStringLiteral(_)
        | Token::EscapedStringLiteral(_)
        | Token::UnicodeStringLiteral(_)
        | Token::HexStringLiteral(_)
        | Token::SingleQuotedByteStringLiteral(_)
        | Token::DoubleQuotedByteStringLiteral(_) => false,
        _ => true,
    }
}

/// Clause keywords that end a `FROM` list.
const ENDS_FROM: &[&str] = &[
    "WHERE",
    "GROUP",
    "HAVING",
    "ORDER",
    "LIMIT",
    "OFFSET",
    "UNION",
    "EXCEPT",
    "INTERSECT",
    "WINDOW",
    "QUALIFY",
    "FETCH",
    "RETURNING",
];

/// Scans `sql`'s tokens and refuses a text past the limits. A text that does not tokenize
/// is let through: the parser will say what is wrong with it.
pub fn check(sql: &str) -> Result<Shape, PgWireError> {
    let Ok(tokens) = Tokenizer::new(&PostgreSqlDialect {}, sql).tokenize() else {
        return Ok(Shape {
            statements: 1,
            ..Shape::default()
        });
    };
    let mut shape = Shape::default();
    // One frame per open parenthesis (the outermost for the text itself): the operators
    // chained in it since its last comma, and whether it is a function call's.
    let mut frames: Vec<(usize, bool)> = vec![(0, false)];
    // Tokens since the last comma, per frame.
    let mut runs: Vec<usize> = vec![0];
    // Per frame: whether a query (`SELECT`) began in it, and whether its tokens are in a
    // `FROM` list now (where a comma names one more relation). A `FROM` in a frame without
    // a query is a function's (`extract(day FROM t)`) and names none.
    let mut clauses: Vec<(bool, bool)> = vec![(false, false)];
    let (mut chained, mut functions) = (0usize, 0usize);
    let mut in_statement = false;
    let mut previous_word = false;
    // The two tokens before this one (whitespace skipped): a lookup cast's type follows
    // `::`, `AS` (of `CAST`), or `pg_catalog.` after either.
    let mut before: [Option<&Token>; 4] = [None; 4];
    // Per frame: whether it is a `CAST(`'s, where `AS` introduces a type, not an alias.
    let mut cast_frames: Vec<bool> = vec![false];
    for t in &tokens {
        if matches!(t, Token::Whitespace(_)) {
            continue;
        }
        let in_cast = cast_frames.last().copied().unwrap_or(false);
        if let Token::Word(w) = t {
            let word = w.value.to_ascii_uppercase();
            if let Some((_, queries, relations)) = LOOKUP_CASTS.iter().find(|c| c.0 == word) {
                if is_cast_type_position(before, in_cast) {
                    shape.queries += queries;
                    shape.relations += relations;
                }
            }
        }
        match t {
            Token::LParen | Token::LBracket => cast_frames.push(matches!(
                before[0],
                Some(Token::Word(w)) if ["CAST", "TRY_CAST", "SAFE_CAST"]
                    .iter()
                    .any(|c| w.value.eq_ignore_ascii_case(c))
            )),
            Token::RParen | Token::RBracket if cast_frames.len() > 1 => {
                cast_frames.pop();
            }
            _ => {}
        }
        before = [Some(t), before[0], before[1], before[2]];
        // Whatever the construct, an expression is no deeper than its tokens: a run of more
        // than MAX_RUN_TOKENS without a comma or bracket is refused even if no operator
        // above was counted in it (a keyword this list misses cannot overflow a stack).
        if !matches!(
            t,
            Token::Comma | Token::LParen | Token::RParen | Token::LBracket | Token::RBracket
        ) {
            let run = runs.last_mut().expect("the outer run");
            *run += 1;
            shape.longest_run = shape.longest_run.max(*run);
        }
        match t {
            Token::LParen | Token::LBracket => {
                let call = previous_word && matches!(t, Token::LParen);
                functions += usize::from(call);
                frames.push((0, call));
                runs.push(0);
                clauses.push((false, false));
            }
            Token::RParen | Token::RBracket if frames.len() > 1 => {
                runs.pop();
                clauses.pop();
                let (count, function) = frames.pop().expect("more than one frame");
                chained -= count;
                functions -= usize::from(function);
            }
            Token::RParen | Token::RBracket => {}
            Token::Comma => {
                if clauses.last().is_some_and(|c| c.1) {
                    shape.relations += 1;
                }
                *runs.last_mut().expect("the outer run") = 0;
                let top = frames.last_mut().expect("the outer frame");
                chained -= top.0;
                top.0 = 0;
            }
            Token::SemiColon if frames.len() == 1 => {
                runs[0] = 0;
                clauses[0] = (false, false);
                chained -= frames[0].0;
                frames[0].0 = 0;
                shape.statements += usize::from(in_statement);
                in_statement = false;
                previous_word = false;
                continue;
            }
            other => {
                if is_operator(other) {
                    frames.last_mut().expect("the outer frame").0 += 1;
                    chained += 1;
                }
                if let Token::Word(w) = other {
                    if w.quote_style.is_none() {
                        let clause = clauses.last_mut().expect("the outer frame");
                        let word = w.value.to_ascii_uppercase();
                        match word.as_str() {
                            "SELECT" => {
                                shape.queries += 1;
                                *clause = (true, false);
                            }
                            "FROM" if clause.0 => {
                                shape.relations += 1;
                                clause.1 = true;
                            }
                            "JOIN" => shape.relations += 1,
                            w if ENDS_FROM.contains(&w) => clause.1 = false,
                            _ => {}
                        }
                    }
                }
            }
        }
        in_statement = true;
        previous_word = matches!(t, Token::Word(_));
        shape.depth = shape.depth.max(chained + frames.len() - 1);
        shape.function_nesting = shape.function_nesting.max(functions);
    }
    shape.statements += usize::from(in_statement);
    if shape.depth > MAX_DEPTH {
        return Err(too_complex("its expression depth", shape.depth, MAX_DEPTH));
    }
    if shape.longest_run > MAX_RUN_TOKENS {
        return Err(too_complex(
            "its longest expression in tokens",
            shape.longest_run,
            MAX_RUN_TOKENS,
        ));
    }
    if shape.function_nesting > MAX_FUNCTION_NESTING {
        return Err(too_complex(
            "its function nesting",
            shape.function_nesting,
            MAX_FUNCTION_NESTING,
        ));
    }
    if shape.relations > MAX_RELATIONS {
        return Err(too_complex(
            "its number of relations in FROM lists and JOINs",
            shape.relations,
            MAX_RELATIONS,
        ));
    }
    if shape.queries > MAX_QUERIES {
        return Err(too_complex(
            "its number of queries",
            shape.queries,
            MAX_QUERIES,
        ));
    }
    Ok(shape)
}

/// Whether a word after `before` (the tokens just before it, nearest first) is the type of
/// a cast the catalog emulation rewrites: a string literal or a placeholder cast with `::`
/// or `CAST(... AS ...)` (`in_cast`), the type optionally written `pg_catalog.`. A cast of
/// anything else (a column, an expression) is left as it is and costs nothing.
fn is_cast_type_position(before: [Option<&Token>; 4], in_cast: bool) -> bool {
    let word = |t: Option<&Token>, w: &str| matches!(t, Some(Token::Word(x)) if x.quote_style.is_none() && x.value.eq_ignore_ascii_case(w));
    let introducer =
        |t: Option<&Token>| matches!(t, Some(Token::DoubleColon)) || (in_cast && word(t, "AS"));
    let name = |t: Option<&Token>| {
        matches!(
            t,
            Some(Token::SingleQuotedString(_)) | Some(Token::Placeholder(_))
        )
    };
    match before {
        [Some(Token::Period), schema, cast, operand] if word(schema, "pg_catalog") => {
            introducer(cast) && name(operand)
        }
        [cast, operand, _, _] => introducer(cast) && name(operand),
    }
}

/// The statements of `sql`, each as the client wrote it (split at the semicolons between
/// statements; those inside literals, quoted names and comments are tokens of their own and
/// do not split). A text that does not tokenize is returned whole, for the parser to refuse.
pub fn split(sql: &str) -> Vec<&str> {
    let Ok(tokens) = Tokenizer::new(&PostgreSqlDialect {}, sql).tokenize_with_location() else {
        return vec![sql];
    };
    // Byte offset of each line's start: locations are (line, column), 1-based, in chars.
    let mut lines = vec![0usize];
    lines.extend(sql.match_indices('\n').map(|(i, _)| i + 1));
    let offset = |line: u64, column: u64| -> Option<usize> {
        let start = *lines.get(usize::try_from(line).ok()?.checked_sub(1)?)?;
        let skip = usize::try_from(column).ok()?.checked_sub(1)?;
        Some(match sql[start..].char_indices().nth(skip) {
            Some((i, _)) => start + i,
            None => sql.len(),
        })
    };
    let mut out = Vec::new();
    let mut from = 0;
    for t in &tokens {
        if t.token == Token::SemiColon {
            let Some(at) = offset(t.span.start.line, t.span.start.column) else {
                return vec![sql];
            };
            if sql[from..at].trim().is_empty() {
                from = at + 1;
                continue;
            }
            out.push(&sql[from..at]);
            from = at + 1;
        }
    }
    if !sql[from..].trim().is_empty() || out.is_empty() {
        out.push(&sql[from..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(sql: &str) -> String {
        match check(sql) {
            Ok(_) => "ok".into(),
            Err(PgWireError::UserError(i)) => i.code.clone(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn ordinary_statements_pass_and_are_counted() {
        let s = check("SELECT a, b + 1 FROM t WHERE x = 1 AND (y < 2 OR z IN (1, 2, 3))").unwrap();
        assert_eq!(s.statements, 1);
        assert!(s.depth < 10, "{s:?}");
        assert_eq!(check("SELECT 1; SELECT 2;;").unwrap().statements, 2);
        assert_eq!(check("  ; ").unwrap().statements, 0);
        // Long lists are wide, not deep.
        let list: Vec<String> = (0..20_000).map(|i| format!("({i}, -{i})")).collect();
        assert_eq!(
            code(&format!("INSERT INTO t VALUES {}", list.join(", "))),
            "ok"
        );
        let ins: Vec<String> = (0..20_000).map(|i| i.to_string()).collect();
        assert_eq!(
            code(&format!("SELECT 1 WHERE a IN ({})", ins.join(", "))),
            "ok"
        );
        // Operators inside string literals do not count.
        assert_eq!(code(&format!("SELECT '{}'", "+".repeat(10_000))), "ok");
        // A CASE of hundreds of branches is wide, not deep.
        let branches: String = (0..600)
            .map(|i| format!(" WHEN x = {i} THEN 'b{i}'"))
            .collect();
        assert_eq!(code(&format!("SELECT CASE{branches} END FROM t")), "ok");
    }

    #[test]
    fn statements_split_where_they_end() {
        assert_eq!(split("SELECT 1; SELECT 2"), vec!["SELECT 1", " SELECT 2"]);
        assert_eq!(
            split("SELECT 1;;\n ; SELECT 2;"),
            vec!["SELECT 1", " SELECT 2"]
        );
        assert_eq!(
            split("SELECT ';' AS \"a;b\" -- c;d\n; SELECT $$x;y$$"),
            vec!["SELECT ';' AS \"a;b\" -- c;d\n", " SELECT $$x;y$$"]
        );
        assert_eq!(
            split("SELECT 'é'; SELECT 'ü'"),
            vec!["SELECT 'é'", " SELECT 'ü'"]
        );
        assert_eq!(split("SELECT 'unterminated"), vec!["SELECT 'unterminated"]);
    }

    /// Chains of keyword operators nest as deep as symbol ones (a tester's `SELECT 1 IS NULL
    /// IS NULL ...` of 8,000 terms overflowed a 32 MiB stack), and `IN (...)` chains keep
    /// their depth past the closing parenthesis.
    #[test]
    fn keyword_chains_and_bracket_nesting_are_refused() {
        for (each, n) in [
            (" IS NULL", 1_500),
            (" IS TRUE", 1_500),
            (" LIKE 'a'", 1_500),
            (" AT TIME ZONE 'UTC'", 1_500),
            (" IN (1)", 1_500),
            (" ISNULL", 1_500),
            (" COLLATE \"C\"", 1_500),
        ] {
            assert_eq!(
                code(&format!("SELECT 1{}", each.repeat(n))),
                "54001",
                "{each}"
            );
            assert_eq!(
                code(&format!("SELECT 1{}", each.repeat(50))),
                "ok",
                "{each}"
            );
        }
        assert_eq!(code(&format!("SELECT {}1", "NOT ".repeat(1_500))), "54001");
        let cases = "CASE WHEN true THEN ".repeat(1_500);
        assert_eq!(code(&format!("SELECT {cases}1")), "54001");
        let arrays = format!("SELECT {}1{}", "[".repeat(1_500), "]".repeat(1_500));
        assert_eq!(code(&arrays), "54001");
        // The backstop: a run of tokens no listed operator joins.
        let words = "x ".repeat(MAX_RUN_TOKENS + 1);
        assert_eq!(code(&format!("SELECT {words}")), "54001");
    }

    #[test]
    fn deep_chains_nesting_and_many_queries_are_refused() {
        let terms = vec!["1"; MAX_DEPTH + 2].join("+");
        assert_eq!(code(&format!("SELECT {terms}")), "54001");
        let ors = vec!["a = 1"; MAX_DEPTH].join(" OR ");
        assert_eq!(code(&format!("SELECT 1 WHERE {ors}")), "54001");
        let parens = format!(
            "SELECT {}1{}",
            "(".repeat(MAX_DEPTH + 1),
            ")".repeat(MAX_DEPTH + 1)
        );
        assert_eq!(code(&parens), "54001");
        let n = MAX_FUNCTION_NESTING + 1;
        let nested = format!("SELECT {}1{}", "coalesce(".repeat(n), ")".repeat(n));
        assert_eq!(code(&nested), "54001");
        let ok = MAX_FUNCTION_NESTING;
        let nested = format!("SELECT {}1{}", "coalesce(".repeat(ok), ")".repeat(ok));
        assert_eq!(code(&nested), "ok");
        let unions = vec!["SELECT 1"; MAX_QUERIES + 1].join(" UNION ALL ");
        assert_eq!(code(&unions), "54001");
        // A chain split by commas is not one chain.
        let wide: Vec<String> = (0..MAX_DEPTH).map(|_| "1+1".to_string()).collect();
        assert_eq!(code(&format!("SELECT {}", wide.join(", "))), "ok");
    }

    /// Relations are counted in FROM lists, JOINs and subqueries, not in a function's
    /// `FROM` or after the list ends; one past the limit is refused.
    #[test]
    fn relations_past_the_limit_are_refused() {
        let relations = |sql: &str| check(sql).unwrap().relations;
        assert_eq!(relations("SELECT 1"), 0);
        assert_eq!(relations("SELECT * FROM a, b JOIN c ON a.x = c.x, d"), 4);
        assert_eq!(
            relations("SELECT extract(day FROM t), substring(s FROM 2 FOR 3) FROM a"),
            1
        );
        assert_eq!(
            relations("SELECT a, b FROM t WHERE x IN (SELECT y FROM u, v) ORDER BY a, b"),
            3
        );
        assert_eq!(
            relations("SELECT 1 FROM a LEFT JOIN (SELECT 1 FROM b CROSS JOIN c) s USING (k), d"),
            5
        );
        assert_eq!(relations("SELECT 1 FROM a; SELECT 2 FROM b, c"), 3);
        let list = |n: usize| {
            let items: Vec<String> = (0..n).map(|i| format!("chat a{i}")).collect();
            format!("SELECT 1 FROM {}", items.join(", "))
        };
        assert_eq!(code(&list(MAX_RELATIONS)), "ok");
        assert_eq!(code(&list(MAX_RELATIONS + 1)), "54001");
        assert_eq!(code(&list(1_000)), "54001");
        let joins: String = (1..=MAX_RELATIONS)
            .map(|i| format!(" JOIN chat a{i} ON a{i}.id = a0.id"))
            .collect();
        assert_eq!(code(&format!("SELECT 1 FROM chat a0{joins}")), "54001");
    }

    /// A lookup cast counts as the subquery pg_catalog's emulation turns it into, however
    /// it is spelled; the same word as a name counts as nothing.
    #[test]
    fn lookup_casts_count_as_the_subqueries_they_become() {
        let counts = |sql: &str| {
            let s = check(sql).unwrap();
            (s.queries, s.relations)
        };
        assert_eq!(counts("SELECT 'chat'::regclass"), (3, 3));
        assert_eq!(counts("SELECT 'chat'::pg_catalog.regclass"), (3, 3));
        assert_eq!(counts("SELECT CAST('chat' AS REGCLASS)"), (3, 3));
        assert_eq!(
            counts("SELECT 'public'::regnamespace, 'int4'::regtype"),
            (3, 2)
        );
        assert_eq!(counts("SELECT CAST($1 AS pg_catalog.regclass)"), (3, 3));
        assert_eq!(counts("SELECT regclass FROM t"), (1, 1));
        assert_eq!(counts("SELECT x AS regclass FROM t"), (1, 1));
        // Casts of columns and expressions are not rewritten, so they cost nothing.
        assert_eq!(counts("SELECT oid::regclass FROM pg_class"), (1, 1));
        assert_eq!(counts("SELECT CAST(oid AS regclass) FROM pg_class"), (1, 1));
        assert_eq!(counts("SELECT 'chat'::text::regclass"), (1, 0));
        let columns: Vec<String> = (0..40).map(|i| format!("oid::regclass AS c{i}")).collect();
        assert_eq!(
            code(&format!("SELECT {} FROM pg_class", columns.join(", "))),
            "ok"
        );
        // psql's `\d chat` asks one lookup, far within the limits.
        let casts = |n: usize| {
            let items: Vec<String> = (0..n).map(|i| format!("'t{i}'::regclass")).collect();
            format!("SELECT {}", items.join(", "))
        };
        assert_eq!(code(&casts(MAX_RELATIONS / 3)), "ok");
        assert_eq!(code(&casts(MAX_RELATIONS / 3 + 1)), "54001");
    }
}
