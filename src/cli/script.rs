//! The shell's script splitting: statements end at `;` outside quotes and comments, and a
//! line starting with `\` between statements is a meta-command (`\d`, `\buckets`). Used
//! for `-c`, `-f`, piped standard input and the interactive shell alike.

/// One unit of a script.
#[derive(Debug, PartialEq, Eq)]
pub enum Item {
    /// A SQL statement, without its `;`.
    Sql(String),
    /// A meta-command line (`\d chat`).
    Meta(String),
}

/// Whether the buffer ends with a `;` outside quotes and comments.
pub fn statement_complete(buf: &str) -> bool {
    let items = scan(buf);
    items.1
}

/// Splits a script into statements (ending at `;` outside quotes and comments) and
/// meta-command lines (a line starting with `\` between statements).
pub fn split_script(text: &str) -> Vec<Item> {
    scan(text).0
}

fn scan(text: &str) -> (Vec<Item>, bool) {
    let mut items = Vec::new();
    let mut cur = String::new();
    let mut chars = text.chars().peekable();
    let mut ended = false;
    let mut at_line_start = true;
    while let Some(c) = chars.next() {
        if at_line_start && cur.trim().is_empty() && c == '\\' {
            let mut line = String::from('\\');
            for n in chars.by_ref() {
                if n == '\n' {
                    break;
                }
                line.push(n);
            }
            items.push(Item::Meta(line.trim().to_string()));
            cur.clear();
            at_line_start = true;
            ended = true;
            continue;
        }
        at_line_start = c == '\n';
        match c {
            '\'' | '"' => {
                cur.push(c);
                for n in chars.by_ref() {
                    cur.push(n);
                    if n == c {
                        break;
                    }
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                for n in chars.by_ref() {
                    if n == '\n' {
                        cur.push('\n');
                        at_line_start = true;
                        break;
                    }
                }
            }
            ';' => {
                let s = cur.trim().to_string();
                if !s.is_empty() {
                    items.push(Item::Sql(s));
                }
                cur.clear();
                ended = true;
                continue;
            }
            _ => cur.push(c),
        }
        if !c.is_whitespace() {
            ended = false;
        }
    }
    let rest = cur.trim().to_string();
    if !rest.is_empty() {
        items.push(Item::Sql(rest));
        ended = false;
    }
    (items, ended)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_split_on_semicolons_outside_quotes_and_comments() {
        let items = split_script("SELECT ';' AS x; -- a; comment\nSELECT 2;\n\\d chat\nSELECT\n 3");
        assert_eq!(
            items,
            vec![
                Item::Sql("SELECT ';' AS x".into()),
                Item::Sql("SELECT 2".into()),
                Item::Meta("\\d chat".into()),
                Item::Sql("SELECT\n 3".into()),
            ]
        );
        assert!(statement_complete("SELECT 1;\n"));
        assert!(!statement_complete("SELECT ';\n"));
        assert!(!statement_complete("SELECT 1\n"));
        assert!(!statement_complete("SELECT 1; -- x\nSELECT"));
    }
}
