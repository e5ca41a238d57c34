//! What one connection keeps between messages: its prepared statements and portals.
//!
//! pgwire keeps every statement a Parse names until a Close (PostgreSQL too), and every
//! portal a Bind names; each holds its text, its parsed form and, for a portal, its bound
//! values. A client that never closes them could hold memory without bound (110 Parse
//! messages of 5 MB took a server past 2 GiB), outside the memory pools that bound queries.
//! The connection loop therefore accounts for them here, by name, before pgwire sees the
//! message: at most [`MAX_RETAINED`] named statements and portals together, and at most
//! [`MAX_RETAINED_BYTES`] (or `--max-message-bytes`, if smaller) of statement text and
//! bound values. A Parse or Bind past either is refused with SQLSTATE 54000 naming the
//! limit; Close releases. A portal counts its statement's text too, since it keeps the
//! statement alive after the statement's own Close.

use std::collections::HashMap;

use datafusion_postgres::pgwire::error::ErrorInfo;
use datafusion_postgres::pgwire::messages::extendedquery::{
    TARGET_TYPE_BYTE_PORTAL, TARGET_TYPE_BYTE_STATEMENT,
};
use datafusion_postgres::pgwire::messages::PgWireFrontendMessage;

use super::memory::human;

/// Most named statements and portals one connection may keep.
pub const MAX_RETAINED: usize = 1_000;
/// Most bytes of statement text and bound values one connection may keep.
pub const MAX_RETAINED_BYTES: usize = 64 << 20;

/// What a message keeps or releases once pgwire has handled it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Effect {
    /// A statement of this name and size, replacing any of the same name.
    Statement(String, usize),
    /// A portal of this name and size, replacing any of the same name.
    Portal(String, usize),
    /// Releases a statement.
    CloseStatement(String),
    /// Releases a portal.
    ClosePortal(String),
}

/// The statements and portals one connection keeps, by name, with their sizes.
pub(super) struct Retained {
    statements: HashMap<String, usize>,
    portals: HashMap<String, usize>,
    bytes: usize,
    max_bytes: usize,
}

impl Retained {
    /// The accounts of a new connection of a server whose longest message is
    /// `max_message_bytes`.
    pub(super) fn new(max_message_bytes: usize) -> Self {
        Self {
            statements: HashMap::new(),
            portals: HashMap::new(),
            bytes: 0,
            max_bytes: MAX_RETAINED_BYTES.min(max_message_bytes),
        }
    }

    /// The named statements and portals (the unnamed ones are one each, replaced by the
    /// next, and count in bytes only).
    fn count(&self) -> usize {
        let named = |m: &HashMap<String, usize>| m.len() - usize::from(m.contains_key(""));
        named(&self.statements) + named(&self.portals)
    }

    /// What `message` will keep or release, or the refusal (54000) of one that would keep
    /// more than the limits allow.
    // The refusal goes straight to the client as an ErrorResponse; no `?` chain carries it.
    #[allow(clippy::result_large_err)]
    pub(super) fn check(
        &self,
        message: &PgWireFrontendMessage,
    ) -> Result<Option<Effect>, ErrorInfo> {
        let (kind, name, size, replaced) = match message {
            PgWireFrontendMessage::Parse(p) => {
                let name = p.name.clone().unwrap_or_default();
                let size = name.len() + p.query.len() + 4 * p.type_oids.len();
                let replaced = self.statements.get(&name).copied();
                ("prepared statement", name, size, replaced)
            }
            PgWireFrontendMessage::Bind(b) => {
                let name = b.portal_name.clone().unwrap_or_default();
                let statement = b.statement_name.as_deref().unwrap_or_default();
                let values: usize = b
                    .parameters
                    .iter()
                    .map(|p| p.as_ref().map_or(0, |v| v.len()))
                    .sum();
                let size = name.len()
                    + values
                    + self.statements.get(statement).copied().unwrap_or(0)
                    + 2 * (b.parameter_format_codes.len() + b.result_column_format_codes.len());
                let replaced = self.portals.get(&name).copied();
                ("portal", name, size, replaced)
            }
            PgWireFrontendMessage::Close(c) => {
                let name = c.name.clone().unwrap_or_default();
                return Ok(match c.target_type {
                    TARGET_TYPE_BYTE_STATEMENT => Some(Effect::CloseStatement(name)),
                    TARGET_TYPE_BYTE_PORTAL => Some(Effect::ClosePortal(name)),
                    _ => None,
                });
            }
            PgWireFrontendMessage::Sync(_) => {
                // pgwire drops the unnamed portal at each Sync.
                return Ok(Some(Effect::ClosePortal(String::new())));
            }
            _ => return Ok(None),
        };
        let count = self.count() + usize::from(replaced.is_none() && !name.is_empty());
        let bytes = self.bytes - replaced.unwrap_or(0) + size;
        if count > MAX_RETAINED || bytes > self.max_bytes {
            return Err(ErrorInfo::new(
                "ERROR".into(),
                "54000".into(),
                format!(
                    "{kind} \"{name}\" refused: a connection keeps at most {MAX_RETAINED} \
                     named prepared statements and portals and {} of their text and values; \
                     this one keeps {} named taking {} in all, and the new one would take {} \
                     (Close the ones no longer needed)",
                    human(self.max_bytes),
                    self.count(),
                    human(self.bytes),
                    human(size),
                ),
            ));
        }
        Ok(Some(match message {
            PgWireFrontendMessage::Parse(_) => Effect::Statement(name, size),
            _ => Effect::Portal(name, size),
        }))
    }

    /// Records what a message pgwire handled without error kept or released.
    pub(super) fn apply(&mut self, effect: Effect) {
        let (map, name, size) = match effect {
            Effect::Statement(n, s) => (&mut self.statements, n, Some(s)),
            Effect::Portal(n, s) => (&mut self.portals, n, Some(s)),
            Effect::CloseStatement(n) => (&mut self.statements, n, None),
            Effect::ClosePortal(n) => (&mut self.portals, n, None),
        };
        let old = match size {
            Some(s) => {
                self.bytes += s;
                map.insert(name, s)
            }
            None => map.remove(&name),
        };
        self.bytes -= old.unwrap_or(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion_postgres::pgwire::messages::extendedquery::{Close, Parse};

    fn parse(name: &str, len: usize) -> PgWireFrontendMessage {
        PgWireFrontendMessage::Parse(Parse::new(Some(name.to_string()), "x".repeat(len), vec![]))
    }

    fn close(name: &str) -> PgWireFrontendMessage {
        PgWireFrontendMessage::Close(Close::new(
            TARGET_TYPE_BYTE_STATEMENT,
            Some(name.to_string()),
        ))
    }

    fn run(r: &mut Retained, m: PgWireFrontendMessage) -> Result<(), String> {
        let e = r
            .check(&m)
            .map_err(|e| format!("{} {}", e.code, e.message))?;
        if let Some(e) = e {
            r.apply(e);
        }
        Ok(())
    }

    #[test]
    fn bytes_and_counts_are_bounded_and_close_releases() {
        let mut r = Retained::new(10_000);
        run(&mut r, parse("a", 4_000)).unwrap();
        run(&mut r, parse("b", 4_000)).unwrap();
        let e = run(&mut r, parse("c", 4_000)).unwrap_err();
        assert!(e.starts_with("54000") && e.contains("\"c\""), "{e}");
        // Replacing a statement counts its new size only.
        run(&mut r, parse("b", 5_000)).unwrap();
        run(&mut r, close("a")).unwrap();
        run(&mut r, parse("c", 4_000)).unwrap();
        assert_eq!(r.bytes, 5_001 + 4_001);
        let mut r = Retained::new(usize::MAX);
        for i in 0..MAX_RETAINED {
            run(&mut r, parse(&i.to_string(), 1)).unwrap();
        }
        assert!(run(&mut r, parse("one more", 1)).is_err());
        run(&mut r, parse("0", 1)).unwrap();
        run(&mut r, close("0")).unwrap();
        run(&mut r, parse("one more", 1)).unwrap();
        // The unnamed statement is not one of the named.
        run(&mut r, parse("", 1)).unwrap();
    }
}
